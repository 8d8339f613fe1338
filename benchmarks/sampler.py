"""Decode throughput of our engine vs Hugging Face `generate`, same tiny Qwen3 weights.

  .venv/bin/python benchmarks/sampler.py [--batch 8 --prompt 64 --new 128 --repeats 1]
      [--dtype bfloat16] [--hidden 1024 --layers 16] [--no-hf] [--small]

A random `transformers.Qwen3ForCausalLM` (~13M parameters by default; `--hidden`
and `--layers` scale it) is saved to a temporary directory and loaded into
sao_jax with `sao_jax.models.hf.load_hf`, params and compute in `--dtype`
(torch stays float32). `--no-hf` skips the transformers side (its keys are left
out); `--small` shrinks every size for a quick check on CPU
(`benchmarks/accelerator.sh --small`).
Both sides generate `--new` tokens for the same `--batch` prompts of `--prompt`
tokens, sampling at temperature 1 with no top-k/top-p and no stop tokens, so
every sequence runs to the end. tokens/s = batch * new / wall time of the whole
generation (prefill included), best of `--repeats` after a short warm-up run (our
compilation is excluded, as is torch's first-call overhead).

Profile of our decode call (K = steps_per_call steps over all slots): the model
step alone (`decode.extend` of one token per slot, jitted in a K-step scan), the
sampler alone (temperature softmax + inverse-CDF draw on [slots, vocab]), one
slot's prefill are timed separately; what the run spends beyond those calls is
host bookkeeping. A decode step at small batch reads every weight once, so the
weight-read time at the measured memory bandwidth (a jitted sum over 256 MiB)
is its floor.

Paged vs dense at the same KV memory (`speedup_paged_vs_dense_longtail`): the
same model generates `--longtail-episodes` episodes whose lengths are long-tailed
(lognormal, median max_seq_len / 8, sigma 1, clipped at max_seq_len so a few run
to the end; a 16-token prompt, no stop tokens) on the dense engine with
`--dense-slots` rows of max_seq_len tokens, and on the paged engine with a pool
of exactly the same number of token positions and `--paged-slots` slots. Ratio
of sampled tokens/s (wall time, prefill and preemption included, compilation
excluded; `paged_vs_dense_decode_call` is the same ratio for one decode call with
every slot busy, the device program alone; the engines' calls alternate, best of
`--repeats`), in the steady state: until the last episode is admitted, since a
finite batch's drain (its longest episode alone) measures the tail, not the
engine. `dense_same_batch_vs_dense_decode_call` bounds the paged decode call: a dense
engine with the paged engine's slots, each a row of the same KV memory split
evenly (the batch without pages; it could not hold the long tail).

`decode_bandwidth_fraction`: the paged engine's decode step (its decode call
with every slot busy, over the pages split evenly, / steps_per_call) against
its floor, reading params + the listed pages' keys and values once at the
memory bandwidth measured in this run: floor_s / step_s (1 = bandwidth bound).
`decode_roofline_fraction` takes the larger of that floor and the step's FLOPs
at the rate of a jitted matmul measured in the run (where a step is compute
bound, as a batch of 32 is on a CPU, the bandwidth floor is not reachable).

`prefill_batched_speedup`: 16 observations of 128 tokens prefilled by the paged
engine's program in one 16-row call vs 16 one-row calls. Both sides do the same
FLOPs (XLA `cost_analysis`, printed with the FLOP/s each achieves): one call
can only win where a 128-token row leaves the device idle (an accelerator's
launch and weight-read time), not where a row already runs at the matmul rate.

`pool_bytes_per_device_ratio`: the paged pool's bytes on one device, split over
the local devices as a sharded sampler lays it out (pages over data =
devices / tensor, KV heads over tensor, `sao_jax.models.paged_mesh`), over its
bytes per device split over tensor alone (the layout before the split: pages
whole on every chip of the data axis); target <= 1 / data, printed with the
mesh (`pool_page_shards` = data). One device: 1.

`plan_block_sizes_match_run`: 1 when the Pallas kernel block sizes that sao-plan
compiles into a small paged config's decode call on a v5e:2x2 topology (recorded
while `aot.plan` traces on the topology's compile-only devices, `Plan.kernel_blocks`)
equal those a sampler running that config on v5e chips uses (`aot_plan.
run_kernel_blocks`: `sao_jax.models.paged_blocks.kernel_blocks` at one chip's
shapes), else 0; null, with the reason printed, where libtpu is not installed
(nothing compiles for a TPU then). It needs no TPU: the plan compiles on the CPU.

`logp_parity_max_abs`: the largest |behavior_logp - policy_forward logp| over
the engine's sampled tokens in the throughput run (the learner's forward on the
same params and dtype). The last line is `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from sao_jax.config.sampler import SamplerConfig
from sao_jax.models import decode, forward, hf
from sao_jax.config import AlgorithmConfig, Config, LearnerConfig, MeshConfig, ModelConfig
from sao_jax.models.paged_mesh import pool_head_axis
from sao_jax.planning import aot, hardware
from sao_jax.sampler import sampling, steps
from sao_jax.sampler.kv_layout import kv_layout
from sao_jax.sharding.mesh import make_mesh
from sao_jax.sampler.engine import Engine
from sao_jax.sampler.paged_engine import PagedEngine

from aot_plan import run_kernel_blocks  # this folder's: the run's sizes of a planned config

HF_CONFIG = dict(vocab_size=8192, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                 num_attention_heads=6, num_key_value_heads=2, head_dim=64, rope_theta=10000.0,
                 max_position_embeddings=1024, tie_word_embeddings=True)


SMALL = dict(batch=2, prompt=8, new=16, steps_per_call=4, longtail_episodes=12,
             longtail_max_len=128, dense_slots=2, paged_slots=4, prefill_rows=4, prefill_chunk=16)


def load_model(args):
  """(torch model, our cfg, our params, param count): a random Qwen3 of HF_CONFIG with
  `--hidden`/`--layers` applied (heads of 64, MLP 8/3 x hidden), ours in `--dtype`."""
  hf_config = dict(HF_CONFIG)
  if args.hidden:
    hf_config.update(hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                     num_attention_heads=args.hidden // 64,
                     num_key_value_heads=max(1, args.hidden // 192))
  if args.layers:
    hf_config.update(num_hidden_layers=args.layers)
  torch.manual_seed(0)
  model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**hf_config)).eval()
  with tempfile.TemporaryDirectory() as path:
    model.save_pretrained(path)
    cfg, params = hf.load_hf(path, param_dtype=args.dtype, compute_dtype=args.dtype)
  return model, cfg, params, sum(p.numel() for p in model.parameters())


def _best(fn, repeats: int, warmup=None) -> float:
  (warmup or fn)()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


def hf_threads(model, prompts: np.ndarray) -> int:
  """The faster torch thread count, 1 or the default, on a short generation: with the
  cores oversubscribed, torch's spinning OpenMP threads can be ~10x slower than one."""
  ids = torch.tensor(prompts)
  default, times = torch.get_num_threads(), {}
  for threads in sorted({1, default}):
    torch.set_num_threads(threads)
    with torch.no_grad():
      generate = lambda: model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                        top_k=0, max_new_tokens=8, min_new_tokens=8,
                                        eos_token_id=None, pad_token_id=0)
      times[threads] = _best(generate, 1)
  best = min(times, key=times.get)
  torch.set_num_threads(best)
  return best


def hf_seconds(model, prompts: np.ndarray, new: int, repeats: int) -> float:
  ids = torch.tensor(prompts)

  def generate(new=new):
    with torch.no_grad():
      out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                           top_k=0, top_p=1.0, max_new_tokens=new, min_new_tokens=new,
                           eos_token_id=None, pad_token_id=0)
    assert out.shape == (len(prompts), prompts.shape[1] + new)

  return _best(generate, repeats, warmup=lambda: generate(new=4))


def ours_seconds(engine: Engine, prompts: np.ndarray, new: int, repeats: int) -> float:
  counter = iter(range(10**9))

  def generate(new=new):
    ids = [next(counter) for _ in prompts]
    for i, prompt in zip(ids, prompts):
      engine.submit(i, prompt, seed=i, max_new_tokens=new)
    while engine.busy:
      engine.step()
    for i in ids:
      assert len(engine.finish(i).tokens) == prompts.shape[1] + new

  return _best(generate, repeats, warmup=lambda: generate(new=4))


def profile(engine: Engine, cfg, params, sampler_cfg: SamplerConfig, repeats: int) -> dict:
  """Seconds per decode call: whole program, model steps only, sampling only."""
  n, k = sampler_cfg.slots, sampler_cfg.steps_per_call
  token_N = np.zeros(n, np.int32)
  active_N = np.ones(n, bool)
  budget_N = np.full(n, 10**6, np.int32)
  seed_N = np.arange(n, dtype=np.uint32)
  cache = steps.new_cache(cfg, sampler_cfg)
  cache = decode.truncate(cache, jnp.full((n,), 64, jnp.int32))
  program = engine._steps.decode  # the engine's own compiled decode call

  def whole():
    nonlocal cache
    cache, tokens, *_ = program(params, cache, token_N, active_N, budget_N, seed_N)
    cache = decode.truncate(cache, jnp.full((n,), 64, jnp.int32))
    jax.block_until_ready(tokens)

  @jax.jit
  def model_only(params, cache, token_N):
    def body(cache, _):
      logits, cache = decode.extend(params, cfg, cache, token_N[:, None], jnp.ones((n, 1), bool))
      return cache, logits[:, 0]
    return jax.lax.scan(body, cache, length=k)

  @jax.jit
  def sampling_only(logits_NxV):
    def body(x, i):
      keys = sampling.token_keys(jnp.asarray(seed_N), jnp.full((n,), i))
      return x, sampling.sample(logits_NxV + x, keys, 1.0, 0, 1.0)
    return jax.lax.scan(body, jnp.zeros((), jnp.float32), jnp.arange(k))

  prompt_1xC = np.zeros((1, sampler_cfg.prefill_buckets[0]), np.int32)

  def prefill():
    nonlocal cache
    cache, token, _ = engine._steps.prefill(params, cache, np.int32(0), prompt_1xC,
                                            np.ones_like(prompt_1xC), np.int32(0), np.uint32(0))
    jax.block_until_ready(token)

  fresh = steps.new_cache(cfg, sampler_cfg)
  logits = jax.random.normal(jax.random.key(0), (n, cfg.vocab_size))
  return {"prefill": _best(prefill, repeats), "decode call": _best(whole, repeats),
          "model steps": _best(lambda: jax.block_until_ready(model_only(params, fresh, token_N)), repeats),
          "sampling": _best(lambda: jax.block_until_ready(sampling_only(logits)), repeats)}


def matmul_rate(dtype: str, n: int = 1024, repeats: int = 3) -> float:
  """FLOP/s of a jitted n x n `jnp.dot` in dtype: the compute roofline."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  dot = jax.jit(jnp.dot)
  return 2 * n**3 / _best(lambda: jax.block_until_ready(dot(a, a)), repeats)


def memory_bandwidth(n_bytes: int = 1 << 28, repeats: int = 3) -> float:
  """Bytes/s of a jitted read of a large float32 array (x.sum()): the decode roofline."""
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  return n_bytes / _best(lambda: jax.block_until_ready(total(x)), repeats)


def longtail_lengths(n: int, max_seq_len: int, prompt: int, seed: int = 0) -> np.ndarray:
  """Sampled tokens per episode: lognormal, median max_seq_len / 8, clipped to fit."""
  rng = np.random.default_rng(seed)
  lengths = rng.lognormal(np.log(max_seq_len / 8), 1.0, n)
  return np.clip(lengths.astype(int), 1, max_seq_len - prompt)


def longtail_tokens_per_s(engine: Engine, lengths: np.ndarray, prompt: int, vocab: int) -> float:
  """Steady-state sampled tokens/s over episodes of `lengths` sampled tokens: from the
  first submit until the last episode is admitted (the queue runs empty); the drain
  after that, the longest episodes finishing on a shrinking batch, is not timed."""
  engine.warmup()
  prompts = np.random.default_rng(1).integers(0, vocab, (len(lengths), prompt))
  start = time.perf_counter()
  for i, (length, tokens) in enumerate(zip(lengths, prompts)):
    engine.submit(i, tokens, seed=i, max_new_tokens=int(length))
  while engine.queued:
    engine.step()
  seconds = time.perf_counter() - start
  return engine.stats["sampled_tokens"] / seconds


def _powers_of_two(limit: int) -> tuple[int, ...]:
  """1, 2, 4, ... up to `limit` (and `limit`): row buckets that waste at most half a call."""
  return tuple(sorted({min(2**i, limit) for i in range(limit.bit_length() + 1)}))


def paged_vs_dense(cfg, params, args) -> dict:
  """Sampled tokens/s of both engines at the same KV memory on a long-tailed mix."""
  prompt, page = 16, 16
  lengths = longtail_lengths(args.longtail_episodes, args.longtail_max_len, prompt)
  base = SamplerConfig(kv_layout="dense", slots=args.dense_slots, max_seq_len=args.longtail_max_len,
                       prefill_buckets=(prompt,), steps_per_call=args.steps_per_call,
                       stop_patterns=(), max_new_tokens=args.longtail_max_len)
  dense_tps = longtail_tokens_per_s(Engine(base, cfg, params), lengths, prompt, cfg.vocab_size)
  pages = args.dense_slots * args.longtail_max_len // page  # the dense cache's token positions
  paged_cfg = dataclasses.replace(base, kv_layout="paged", slots=args.paged_slots,
                                  kv_page_size=page, kv_pages=pages,
                                  prefill_row_buckets=_powers_of_two(args.paged_slots))
  paged = PagedEngine(paged_cfg, cfg, params)
  paged_tps = longtail_tokens_per_s(paged, lengths, prompt, cfg.vocab_size)
  same_batch = dataclasses.replace(base, slots=args.paged_slots,
                                   max_seq_len=pages * page // args.paged_slots)
  calls = full_decode_calls_s({"dense": Engine(base, cfg, params), "paged": paged,
                               "same_batch": Engine(same_batch, cfg, params)}, args.repeats)
  tps = lambda name, slots: slots * args.steps_per_call / calls[name]
  return {"lengths": lengths, "dense_tps": dense_tps, "paged_tps": paged_tps,
          "preemptions": paged.stats["preemptions"], "pages": pages, "engine": paged,
          "paged_call_s": calls["paged"], "dense_step_tps": tps("dense", args.dense_slots),
          "paged_step_tps": tps("paged", args.paged_slots),
          "same_batch_step_tps": tps("same_batch", args.paged_slots)}


def full_decode_calls_s(engines: dict[str, Engine], repeats: int) -> dict[str, float]:
  """Best seconds of each engine's decode call with every slot active (a paged
  engine's pool split evenly among its slots): the device programs alone, no host
  scheduling. The engines take turns call by call, so a change in the machine's
  load hits all of them alike."""
  calls = {}
  for name, engine in engines.items():
    n = engine.cfg.slots
    engine._active_N[:], engine._budget_N[:] = True, 10**6
    if isinstance(engine, PagedEngine):
      for slot in range(n):
        engine._pool.release(slot)
      for slot in range(n):
        engine._pool.ensure(slot, engine._pool.num_pages // n * engine.cfg.kv_page_size)

    def call(engine=engine):
      start = time.perf_counter()
      engine._cache, tokens, *_ = engine._decode_call()
      jax.block_until_ready(tokens)
      return time.perf_counter() - start

    calls[name] = call
  for call in calls.values():
    call()  # warm-up (compiles where warmup() was not run)
  best = {name: float("inf") for name in calls}
  for _ in range(max(repeats, 2)):
    for name, call in calls.items():
      best[name] = min(best[name], call())
  return best


def decode_floors(engine: PagedEngine, cfg, params, call_s: float, bandwidth: float,
                  matmul_rate: float) -> dict[str, float]:
  """The paged decode step whose call took call_s with every slot busy (module
  docstring) vs its floors: bytes (params + listed pages) / bandwidth, and FLOPs
  (2 per matmul param per token, 4 * positions * heads * head_dim per token and
  layer for attention) / the measured matmul rate."""
  n = engine.cfg.slots
  listed = int((engine._pool.table_NxM >= 0).sum())
  pool_bytes = sum(x.nbytes for x in engine._cache.kv)
  live_bytes = pool_bytes * listed / engine._pool.num_pages
  n_params = sum(x.size for x in jax.tree.leaves(params))
  matmul_params = n_params - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
  positions = listed * engine.cfg.kv_page_size / n
  flops = n * (2 * matmul_params + 4 * positions * cfg.num_hidden_layers
               * cfg.num_attention_heads * cfg.head_dim)
  return {"step_s": call_s / engine.cfg.steps_per_call,
          "bandwidth_s": (sum(x.nbytes for x in jax.tree.leaves(params)) + live_bytes) / bandwidth,
          "compute_s": flops / matmul_rate}


def prefill_batched_speedup(cfg, params, repeats: int, rows: int = 16,
                            chunk: int = 128) -> dict[str, float]:
  """Seconds and FLOPs of prefilling rows x chunk tokens in one call vs one row per call."""
  sampler_cfg = SamplerConfig(kv_layout="paged", slots=rows, max_seq_len=2 * chunk,
                              prefill_buckets=(chunk,), prefill_row_buckets=(1, rows),
                              stop_patterns=())
  engine = PagedEngine(sampler_cfg, cfg, params)
  for slot in range(rows):
    engine._pool.ensure(slot, chunk)
  tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, (rows, chunk)).astype(np.int32)
  table, zeros = engine._pool.table_NxM, np.zeros(rows, np.int32)
  seeds = np.arange(rows, dtype=np.uint32)

  def call(rows_B, tokens_BxC, start_B, seed_B):
    engine._cache, token, _ = engine._steps.prefill(params, engine._cache, table, rows_B,
                                                    tokens_BxC, np.ones_like(tokens_BxC),
                                                    start_B, seed_B)
    return token

  def flops(rows_B, tokens_BxC):
    compiled = engine._steps.prefill.lower(params, engine._cache, table, rows_B, tokens_BxC,
                                           np.ones_like(tokens_BxC), zeros[:len(rows_B)],
                                           seeds[:len(rows_B)]).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float((cost or {}).get("flops", float("nan")))

  all_rows = np.arange(rows, dtype=np.int32)
  batched = lambda: jax.block_until_ready(call(all_rows, tokens, zeros, seeds))
  one_by_one = lambda: jax.block_until_ready([
      call(np.array([r], np.int32), tokens[r:r + 1], zeros[:1], seeds[r:r + 1]) for r in range(rows)])
  batched_s, single_s = _best(batched, repeats), _best(one_by_one, repeats)
  return {"speedup": single_s / batched_s, "batched_s": batched_s, "single_s": single_s,
          "batched_flops": flops(all_rows, tokens),
          "single_flops": rows * flops(all_rows[:1], tokens[:1])}


def pool_bytes_per_device(cfg, args) -> dict:
  """The long-tail paged pool's bytes per device on a data x tensor mesh of the local
  devices (tensor: the most that divide both the devices and the KV heads), split as
  the engine lays it out vs over tensor alone (module docstring)."""
  n = jax.local_device_count()
  tensor = max(t for t in range(1, n + 1) if n % t == 0 and cfg.num_key_value_heads % t == 0)
  data = n // tensor
  mesh = make_mesh(MeshConfig(data=data, fsdp=1, tensor=tensor), jax.local_devices())
  pages = -(-args.dense_slots * args.longtail_max_len // 16 // data) * data
  sampler_cfg = SamplerConfig(kv_layout="paged", slots=data * args.paged_slots,
                              max_seq_len=args.longtail_max_len, kv_page_size=16, kv_pages=pages)
  pool = kv_layout(sampler_cfg).abstract_cache(cfg, sampler_cfg, mesh).kv[0]
  per_device = lambda sharding: np.prod(sharding.shard_shape(pool.shape)) * pool.dtype.itemsize
  heads_only = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
      None, None, pool_head_axis(dict(mesh.shape), cfg.num_key_value_heads), None))
  return {"ratio": per_device(pool.sharding) / per_device(heads_only), "data": data,
          "tensor": tensor}


# `plan_block_sizes_match_run`: a small paged config whose decode call takes the Pallas
# kernel on a TPU (head_dim a multiple of 128), its pool split over fsdp=2 page shards
# and its heads over tensor=2, planned on a 4-chip v5e topology (seconds to compile).
PLAN_TOPOLOGY = "v5e:2x2"


def plan_config() -> Config:
  """The small config `plan_block_sizes_match_run` plans. Its episodes are claimed to
  run to max_seq_len (`expected_episode_tokens`), so the plan's decode call holds
  exactly `sampler.slots` slots, the run's."""
  model = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=128, attention_impl="blocked", attention_block=16,
                      remat_policy="full", param_dtype="bfloat16", compute_dtype="bfloat16")
  sampler = SamplerConfig(kv_layout="paged", paged_attention="auto", slots=8, max_seq_len=64,
                          kv_page_size=16, expected_episode_tokens=64, sharded=True,
                          mesh=MeshConfig(data=1, fsdp=2, tensor=2))
  return Config(name="plan_blocks", mesh=MeshConfig(fsdp=-1), model=model, sampler=sampler,
                algorithm=AlgorithmConfig.for_variant("sao"),
                learner=LearnerConfig(batch_trajectories=8, micro_batches=2))


def plan_block_sizes_match_run(cfg: Config, topology: str = PLAN_TOPOLOGY
                               ) -> tuple[int | None, str]:
  """(1 if the kernel blocks sao-plan compiles `cfg`'s paged decode call with on
  `topology` (`Plan.kernel_blocks`, recorded while it traces on the topology's
  devices) are the ones the engine's decode call gets on a chip of that topology
  (`aot_plan.run_kernel_blocks`: `paged_blocks.kernel_blocks` at one chip's shapes),
  else 0; what was compared). None where libtpu is missing: nothing can compile for a
  TPU here."""
  try:
    hardware.topology_devices(topology)
  except ImportError as error:
    return None, f"not checked: {error}"
  result = aot.plan(cfg, topology, cfg.sampler.max_seq_len)
  run = run_kernel_blocks(cfg, topology)
  planned = "; ".join(b.describe() for b in result.kernel_blocks) or "none (reference path)"
  return int(result.kernel_blocks == (run,)), f"{topology} plan: {planned}; run: {run.describe()}"


def logp_parity(engine: Engine, cfg, params, prompts: np.ndarray, new: int) -> float:
  """max |behavior_logp - policy_forward logp| over the tokens the engine samples."""
  for i, prompt in enumerate(prompts):
    engine.submit(("parity", i), prompt, seed=i, max_new_tokens=new)
  while engine.busy:
    engine.step()
  done = [engine.finish(("parity", i)) for i in range(len(prompts))]
  tokens_BxT = np.stack([g.tokens for g in done])
  logp_BxT = jax.jit(forward.policy_forward, static_argnums=1)(
      params, cfg, tokens_BxT, np.ones_like(tokens_BxT), engine.cfg.temperature).logp_BxT
  on_BxT = np.stack([g.action_mask for g in done]) == 1
  behavior_BxT = np.stack([g.behavior_logp for g in done])
  return float(np.abs(np.asarray(logp_BxT, np.float32) - behavior_BxT)[on_BxT].max())


def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new", type=int, default=128)
  parser.add_argument("--steps-per-call", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--longtail-episodes", type=int, default=128)
  parser.add_argument("--longtail-max-len", type=int, default=1024)
  parser.add_argument("--dense-slots", type=int, default=8)
  parser.add_argument("--paged-slots", type=int, default=32)
  parser.add_argument("--prefill-rows", type=int, default=16)
  parser.add_argument("--prefill-chunk", type=int, default=128)
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  parser.add_argument("--hidden", type=int, default=0, help="hidden size (0: HF_CONFIG's)")
  parser.add_argument("--layers", type=int, default=0, help="layers (0: HF_CONFIG's)")
  parser.add_argument("--no-hf", action="store_true", help="skip transformers generate")
  parser.add_argument("--small", action="store_true", help="tiny sizes: a quick CPU check")
  args = parser.parse_args()
  if args.small:
    vars(args).update(SMALL)
  return args


def main() -> None:
  args = parse_args()
  model, cfg, params, n_params = load_model(args)
  prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.prompt))
  sampler_cfg = SamplerConfig(kv_layout="dense", slots=args.batch,
                              max_seq_len=args.prompt + args.new,
                              prefill_buckets=(args.prompt,), steps_per_call=args.steps_per_call,
                              max_new_tokens=args.new, stop_patterns=())
  engine = Engine(sampler_cfg, cfg, params)
  start = time.perf_counter()
  engine.warmup()
  compile_s = time.perf_counter() - start
  tokens = args.batch * args.new
  ours_s = ours_seconds(engine, prompts, args.new, args.repeats)
  parity = logp_parity(engine, cfg, params, prompts, args.new)
  prof = profile(engine, cfg, params, sampler_cfg, args.repeats)
  bandwidth = memory_bandwidth()
  # Each decode step streams every weight once; at batch 8 that read bounds the step.
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  bound_s = weight_bytes / bandwidth
  calls = -(-(args.new - 1) // args.steps_per_call)  # the first token comes from prefill
  ours_tps = tokens / ours_s
  result = {"name": "sampler", "dtype": args.dtype, "ours_tokens_per_s": round(ours_tps, 1)}

  rows = [("params", f"{n_params / 1e6:.1f}M (vocab {cfg.vocab_size}, {cfg.num_hidden_layers} "
                     f"layers, {args.dtype})"),
          ("batch x (prompt + new)", f"{args.batch} x ({args.prompt} + {args.new})"),
          ("our compile (warm-up)", f"{compile_s:.1f} s")]
  if not args.no_hf:
    threads = hf_threads(model, prompts)
    hf_s = hf_seconds(model, prompts, args.new, args.repeats)
    rows += [("torch threads (faster of 1, default)", f"{threads}"),
             ("HF generate (float32)", f"{hf_s:.3f} s  {tokens / hf_s:8.0f} tokens/s"),
             ("speedup", f"{hf_s / ours_s:.2f}x")]
    result.update(speedup_vs_transformers=round(hf_s / ours_s, 3),
                  hf_tokens_per_s=round(tokens / hf_s, 1))
  rows += [("ours (engine)", f"{ours_s:.3f} s  {ours_tps:8.0f} tokens/s"),
           ("behavior_logp vs policy_forward", f"max |diff| {parity:.2e}"),
           (f"decode call ({args.steps_per_call} steps)", f"{prof['decode call'] * 1e3:.2f} ms"),
           ("  model steps only", f"{prof['model steps'] * 1e3:.2f} ms"),
           ("  sampling only", f"{prof['sampling'] * 1e3:.2f} ms"),
           ("  weight-read bound", f"{bound_s * args.steps_per_call * 1e3:.2f} ms "
            f"({weight_bytes / 1e6:.0f} MB of weights per step at {bandwidth / 1e9:.1f} GB/s)"),
           (f"prefill ({args.prompt} tokens, one slot)", f"{prof['prefill'] * 1e3:.2f} ms"),
           ("profiled device calls / run",
            f"{(calls * prof['decode call'] + args.batch * prof['prefill']) / ours_s:.2f} "
            f"({calls} decode calls + {args.batch} prefills; the rest is host bookkeeping)")]
  result["logp_parity_max_abs"] = float(f"{parity:.3g}")

  longtail = paged_vs_dense(cfg, params, args)
  paged_speedup = longtail["paged_tps"] / longtail["dense_tps"]
  floors = decode_floors(longtail["engine"], cfg, params, longtail["paged_call_s"], bandwidth,
                         matmul_rate(args.dtype))
  fraction = floors["bandwidth_s"] / floors["step_s"]
  roofline = max(floors["bandwidth_s"], floors["compute_s"]) / floors["step_s"]
  pre = prefill_batched_speedup(cfg, params, args.repeats, args.prefill_rows, args.prefill_chunk)
  split = pool_bytes_per_device(cfg, args)
  lengths = longtail["lengths"]
  step_ratio = lambda key: longtail[key] / longtail["dense_step_tps"]
  gflops = lambda flops, seconds: f"{flops / seconds / 1e9:.1f} GFLOP/s"
  rows += [("long-tail mix (sampled tokens)",
            f"{len(lengths)} episodes, median {int(np.median(lengths))}, mean {lengths.mean():.0f}, "
            f"max {lengths.max()} ({int((lengths == lengths.max()).sum())} at max)"),
           ("KV memory (both engines)", f"{args.dense_slots} x {args.longtail_max_len} tokens = "
            f"{longtail['pages']} pages of 16"),
           (f"dense engine ({args.dense_slots} slots)", f"{longtail['dense_tps']:8.0f} tokens/s"),
           (f"paged engine ({args.paged_slots} slots)",
            f"{longtail['paged_tps']:8.0f} tokens/s ({longtail['preemptions']} preemptions)"),
           ("paged / dense", f"{paged_speedup:.2f}x"),
           ("decode call alone, all slots busy", f"dense {longtail['dense_step_tps']:.0f}, paged "
            f"{longtail['paged_step_tps']:.0f} tokens/s = {step_ratio('paged_step_tps'):.2f}x"),
           (f"  bound: dense, {args.paged_slots} short rows",
            f"{longtail['same_batch_step_tps']:.0f} tokens/s = "
            f"{step_ratio('same_batch_step_tps'):.2f}x"),
           ("paged decode step vs bandwidth floor",
            f"{floors['step_s'] * 1e3:.2f} ms vs {floors['bandwidth_s'] * 1e3:.2f} ms = "
            f"{fraction:.2f}"),
           ("  vs compute floor (FLOPs / matmul rate)",
            f"{floors['compute_s'] * 1e3:.2f} ms; roofline fraction {roofline:.2f}"),
           (f"prefill {args.prefill_rows} x {args.prefill_chunk}: one call / one row per call",
            f"{pre['batched_s'] * 1e3:.1f} ms / {pre['single_s'] * 1e3:.1f} ms = "
            f"{pre['speedup']:.2f}x"),
           ("  achieved", f"{gflops(pre['batched_flops'], pre['batched_s'])} / "
            f"{gflops(pre['single_flops'], pre['single_s'])} (same FLOPs: "
            f"{pre['batched_flops'] / 1e9:.1f} G / {pre['single_flops'] / 1e9:.1f} G)"),
           (f"pool bytes per device, data {split['data']} x tensor {split['tensor']}",
            f"split / tensor only = {split['ratio']:.3f} (target <= 1 / {split['data']})")]
  blocks_match, blocks_compared = plan_block_sizes_match_run(plan_config())
  rows += [("plan's kernel blocks = run's", f"{blocks_match} ({blocks_compared})")]
  width = max(len(name) for name, _ in rows)
  for name, value in rows:
    print(f"{name:<{width}}  {value}")
  result.update(speedup_paged_vs_dense_longtail=round(paged_speedup, 3),
                paged_tokens_per_s=round(longtail["paged_tps"], 1),
                dense_longtail_tokens_per_s=round(longtail["dense_tps"], 1),
                paged_preemptions=longtail["preemptions"],
                paged_vs_dense_decode_call=round(step_ratio("paged_step_tps"), 3),
                dense_same_batch_vs_dense_decode_call=round(step_ratio("same_batch_step_tps"), 3),
                decode_bandwidth_fraction=round(fraction, 3),
                decode_roofline_fraction=round(roofline, 3),
                prefill_batched_speedup=round(pre["speedup"], 3),
                pool_bytes_per_device_ratio=round(float(split["ratio"]), 4),
                pool_page_shards=split["data"],
                plan_block_sizes_match_run=blocks_match)
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
