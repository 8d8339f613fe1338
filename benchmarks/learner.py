"""Learner step throughput on CPU against a matmul roofline, and FSDP memory per device.

  .venv/bin/python benchmarks/learner.py [--batch 8 --seq 32 --steps 5]
      [--dtype bfloat16] [--accelerator [--peak-tflops 989]] [--small]

Model: the ~100M-parameter dense Qwen3 config of benchmarks/forward.py, computing
in `--dtype` (params float32). `--accelerator` runs on the default backend (a
GPU) instead of 8 emulated CPU devices; the FSDP memory comparison then needs 8
devices and is left out with fewer. `--small`: a tiny model and batch, a quick
CPU check (`benchmarks/accelerator.sh --small`).
One full SAO step (`sao_jax.learner.step.train_step` jitted by
`sao_jax.learner.compile.compile_train_step`: value forward, GAE, one DIS policy
update, K=2 value updates) on a synthetic batch: a 40% prompt, then action
tokens whose behaviour log-probs sit near a random model's -log(vocab), and a
0/1 outcome on the last action token. Compared:

  * tokens/s: median over `--steps` timed steps on one device, compile and
    a warm-up step excluded; achieved FLOP/s (XLA `cost_analysis()` FLOPs of the
    compiled step, or 20 * params * tokens if it reports none) as a fraction of
    a large `jnp.dot` in `--dtype` timed right before the steps
    (`roofline_fraction`), and of `--peak-tflops` when given (`mfu`; without it
    `mfu` is the roofline fraction, and `mfu_peak` says which).
  * memory: the step compiled from abstract state and batch for an 8-way FSDP
    mesh over 8 emulated CPU devices and for a 1-device mesh; each program's
    per-device peak from `memory_analysis()` is arguments + outputs - aliased
    (the donated state) + temporaries. fsdp_memory_ratio = 8-way per-device
    peak / 1-device peak (1/8 would be perfect sharding).

The last line is `RESULT {json}` for the side-by-side tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from sao_jax.config import Config, LearnerConfig, MeshConfig, ModelConfig
from sao_jax.learner import compile as compile_lib
from sao_jax.learner import state as state_lib
from sao_jax.sharding.mesh import make_mesh
from sao_jax.types import Batch

# The model of benchmarks/forward.py.
MODEL = ModelConfig(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                    num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                    tie_word_embeddings=True, logits_chunk=128)
SMALL_MODEL = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          tie_word_embeddings=True, logits_chunk=64)
DEVICES = 8
PROMPT_FRACTION = 0.4


def matmul_flops_per_s(n: int = 2048, steps: int = 3, dtype: str = "float32") -> float:
  """FLOP/s of an n x n `jnp.dot` in dtype, mean over `steps` calls after a warm-up."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  dot = jax.jit(jnp.dot)
  jax.block_until_ready(dot(a, b))
  start = time.perf_counter()
  for _ in range(steps):
    out = dot(a, b)
  jax.block_until_ready(out)
  return 2 * n**3 * steps / (time.perf_counter() - start)


def synthetic_batch(cfg: Config, seq: int) -> Batch:
  rng = np.random.default_rng(0)
  b, vocab = cfg.learner.batch_trajectories, cfg.model.vocab_size
  prompt = int(PROMPT_FRACTION * seq)
  action = np.broadcast_to(np.arange(seq) >= prompt, (b, seq))
  behavior_logp = np.where(action, -math.log(vocab) + 0.1 * rng.standard_normal((b, seq)), 0.0)
  rewards = np.zeros((b, seq), np.float32)
  rewards[:, -1] = rng.integers(0, 2, b)
  return Batch(tokens=rng.integers(0, vocab, (b, seq), dtype=np.int32),
               segment_ids=np.ones((b, seq), np.int32),
               action_mask=action.astype(np.int32),
               behavior_logp=behavior_logp.astype(np.float32),
               rewards=rewards,
               prompt_ids=np.broadcast_to(np.arange(b, dtype=np.int32)[:, None], (b, seq)),
               behavior_version=np.zeros((b, seq), np.int32))


def compile_step(cfg: Config, mesh: jax.sharding.Mesh, batch: Batch):
  """The learner's jitted step, compiled from abstract (sharded) state and batch."""
  struct = lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  state = jax.tree.map(struct, state_lib.abstract_state(cfg),
                       compile_lib.state_shardings(cfg, mesh))
  batch = compile_lib.abstract_batch(cfg, mesh, batch.shape[1])  # routing: None unless MoE
  flag = jax.ShapeDtypeStruct((), jnp.bool_, sharding=NamedSharding(mesh, PartitionSpec()))
  step = compile_lib.compile_train_step(cfg, mesh, batch.shape[1])
  return step.lower(state, batch, flag).compile()


def peak_bytes(cfg: Config, mesh: jax.sharding.Mesh, compiled) -> tuple[int, str]:
  """Per-device peak of `compiled`, and how it was counted."""
  stats = compiled.memory_analysis()
  if stats is None:
    shard = lambda leaf, sh: math.prod(sh.shard_shape(leaf.shape)) * leaf.dtype.itemsize
    sizes = jax.tree.map(shard, state_lib.abstract_state(cfg),
                         compile_lib.state_shardings(cfg, mesh))
    return sum(jax.tree.leaves(sizes)), "no memory_analysis: state shards only"
  parts = (stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.alias_size_in_bytes,
           stats.temp_size_in_bytes)
  args, out, alias, temp = (f"{n / 2**30:.2f}" for n in parts)
  return (parts[0] + parts[1] - parts[2] + parts[3],
          f"memory_analysis: args {args} + out {out} - alias {alias} + temp {temp}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8, help="trajectories; a multiple of 8")
  parser.add_argument("--seq", type=int, default=32)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  parser.add_argument("--accelerator", action="store_true", help="default backend, not CPU")
  parser.add_argument("--peak-tflops", type=float, default=0.0, help="the device's peak in --dtype")
  parser.add_argument("--matmul-size", type=int, default=2048, help="n of the roofline n x n dot")
  parser.add_argument("--small", action="store_true", help="tiny model and batch (CPU check)")
  args = parser.parse_args()
  if not args.accelerator:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", DEVICES)
  if args.small:
    args.batch, args.seq, args.steps = 8, 16, 2
  model = dataclasses.replace(SMALL_MODEL if args.small else MODEL, compute_dtype=args.dtype)
  cfg = Config(model=model, learner=LearnerConfig(batch_trajectories=args.batch)).validate()
  batch = synthetic_batch(cfg, args.seq)
  tokens = args.batch * args.seq

  start = time.perf_counter()
  fsdp = len(jax.devices()) >= DEVICES
  if fsdp:
    fsdp_mesh = make_mesh(MeshConfig(fsdp=DEVICES))
    fsdp_peak, fsdp_source = peak_bytes(cfg, fsdp_mesh, compile_step(cfg, fsdp_mesh, batch))
  one_mesh = make_mesh(MeshConfig(fsdp=1), jax.devices()[:1])
  compiled = compile_step(cfg, one_mesh, batch)
  one_peak, one_source = peak_bytes(cfg, one_mesh, compiled)
  compile_s = time.perf_counter() - start

  state = compile_lib.init_sharded_state(cfg, one_mesh, jax.random.key(0))
  n_params = sum(x.size for x in jax.tree.leaves(state.policy_params))
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  if cost and cost.get("flops", 0) > 0:
    flops, flops_source = float(cost["flops"]), "cost_analysis"
  else:
    flops, flops_source = 20.0 * n_params * tokens, "analytic 20*N*tokens"
  device_batch = compile_lib.put_batch(batch, compile_lib.batch_shardings(cfg, one_mesh, args.seq))
  update_policy = jnp.asarray(True)
  state, metrics = compiled(state, device_batch, update_policy)  # warm-up
  jax.block_until_ready(metrics)

  roofline = matmul_flops_per_s(args.matmul_size, dtype=args.dtype)
  peak = args.peak_tflops * 1e12 or roofline
  seconds = []
  for _ in range(args.steps):
    start = time.perf_counter()
    state, metrics = compiled(state, device_batch, update_policy)
    jax.block_until_ready(metrics)
    seconds.append(time.perf_counter() - start)
  step_s = statistics.median(seconds)
  tokens_per_s = tokens / step_s
  achieved = flops / step_s
  assert int(state.policy_version) == args.steps + 1, "a policy update was skipped"

  gib = lambda n: f"{n / 2**30:.3f} GiB"
  rows = [("policy params", f"{n_params / 1e6:.1f}M ({args.dtype} compute, "
                            f"{jax.devices()[0].platform})"),
          ("batch x seq", f"{args.batch} x {args.seq} ({tokens} tokens)"),
          (f"compile ({1 + fsdp} meshes)", f"{compile_s:.1f} s"),
          ("step median", f"{step_s * 1e3:.0f} ms (min {min(seconds) * 1e3:.0f}, "
                          f"max {max(seconds) * 1e3:.0f})"),
          ("tokens/s", f"{tokens_per_s:.1f}"),
          ("step FLOPs", f"{flops / 1e9:.1f} G ({flops_source}; "
                         f"20*N*tokens = {20 * n_params * tokens / 1e9:.1f} G)"),
          ("achieved", f"{achieved / 1e9:.1f} GFLOP/s"),
          ("matmul roofline", f"{roofline / 1e9:.1f} GFLOP/s"),
          ("fraction", f"{achieved / roofline:.3f}"),
          ("mfu", f"{achieved / peak:.3f} of {peak / 1e9:.1f} GFLOP/s"),
          ("1-device peak", f"{gib(one_peak)} ({one_source})")]
  result = {"name": "learner", "dtype": args.dtype, "tokens_per_s": round(tokens_per_s, 1),
            "roofline_fraction": round(achieved / roofline, 3), "mfu": round(achieved / peak, 3),
            "mfu_peak": "--peak-tflops" if args.peak_tflops else "measured matmul"}
  if fsdp:
    rows += [(f"fsdp={DEVICES} peak/device", f"{gib(fsdp_peak)} ({fsdp_source})"),
             ("fsdp memory ratio", f"{fsdp_peak / one_peak:.3f} (ideal {1 / DEVICES:.3f})")]
    result["fsdp_memory_ratio"] = round(fsdp_peak / one_peak, 3)
  for name, value in rows:
    print(f"{name:>22}  {value}")
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
