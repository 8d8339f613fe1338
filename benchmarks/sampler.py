"""Decode throughput of our engine vs Hugging Face `generate`, same tiny Qwen3 weights.

  .venv/bin/python benchmarks/sampler.py [--batch 8 --prompt 64 --new 128 --repeats 1]

A random `transformers.Qwen3ForCausalLM` (~13M parameters, fp32) is saved to a
temporary directory and loaded into sao_jax with `sao_jax.models.hf.load_hf`.
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
is its floor. The last line is `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from sao_jax.config.sampler import SamplerConfig
from sao_jax.models import decode, hf
from sao_jax.sampler import sampling, steps
from sao_jax.sampler.engine import Engine

HF_CONFIG = dict(vocab_size=8192, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                 num_attention_heads=6, num_key_value_heads=2, head_dim=64, rope_theta=10000.0,
                 max_position_embeddings=1024, tie_word_embeddings=True)


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


def memory_bandwidth(n_bytes: int = 1 << 28, repeats: int = 3) -> float:
  """Bytes/s of a jitted read of a large float32 array (x.sum()): the decode roofline."""
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  return n_bytes / _best(lambda: jax.block_until_ready(total(x)), repeats)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new", type=int, default=128)
  parser.add_argument("--steps-per-call", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=1)
  args = parser.parse_args()

  torch.manual_seed(0)
  model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**HF_CONFIG)).eval()
  n_params = sum(p.numel() for p in model.parameters())
  with tempfile.TemporaryDirectory() as path:
    model.save_pretrained(path)
    cfg, params = hf.load_hf(path)
  prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.prompt))

  sampler_cfg = SamplerConfig(slots=args.batch, max_seq_len=args.prompt + args.new,
                              prefill_buckets=(args.prompt,), steps_per_call=args.steps_per_call,
                              max_new_tokens=args.new, stop_patterns=())
  engine = Engine(sampler_cfg, cfg, params)
  start = time.perf_counter()
  engine.warmup()
  compile_s = time.perf_counter() - start
  tokens = args.batch * args.new
  threads = hf_threads(model, prompts)
  hf_s = hf_seconds(model, prompts, args.new, args.repeats)
  ours_s = ours_seconds(engine, prompts, args.new, args.repeats)
  prof = profile(engine, cfg, params, sampler_cfg, args.repeats)
  # Each decode step streams every weight once; at batch 8 that read bounds the step.
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  bound_s = weight_bytes / memory_bandwidth()
  calls = -(-(args.new - 1) // args.steps_per_call)  # the first token comes from prefill
  ours_tps, hf_tps = tokens / ours_s, tokens / hf_s

  rows = [("params", f"{n_params / 1e6:.1f}M (vocab {cfg.vocab_size}, {cfg.num_hidden_layers} layers)"),
          ("batch x (prompt + new)", f"{args.batch} x ({args.prompt} + {args.new})"),
          ("torch threads (faster of 1, default)", f"{threads}"),
          ("our compile (warm-up)", f"{compile_s:.1f} s"),
          ("HF generate", f"{hf_s:.3f} s  {hf_tps:8.0f} tokens/s"),
          ("ours (engine)", f"{ours_s:.3f} s  {ours_tps:8.0f} tokens/s"),
          ("speedup", f"{hf_s / ours_s:.2f}x"),
          (f"decode call ({args.steps_per_call} steps)", f"{prof['decode call'] * 1e3:.2f} ms"),
          ("  model steps only", f"{prof['model steps'] * 1e3:.2f} ms"),
          ("  sampling only", f"{prof['sampling'] * 1e3:.2f} ms"),
          ("  weight-read bound", f"{bound_s * args.steps_per_call * 1e3:.2f} ms "
           f"({weight_bytes / 1e6:.0f} MB of weights per step at the measured bandwidth)"),
          (f"prefill ({args.prompt} tokens, one slot)", f"{prof['prefill'] * 1e3:.2f} ms"),
          ("profiled device calls / run",
           f"{(calls * prof['decode call'] + args.batch * prof['prefill']) / ours_s:.2f} "
           f"({calls} decode calls + {args.batch} prefills; the rest is host bookkeeping)")]
  width = max(len(name) for name, _ in rows)
  for name, value in rows:
    print(f"{name:<{width}}  {value}")
  print("RESULT " + json.dumps({"name": "sampler", "speedup_vs_transformers": round(hf_s / ours_s, 3),
                                "ours_tokens_per_s": round(ours_tps, 1),
                                "hf_tokens_per_s": round(hf_tps, 1)}))


if __name__ == "__main__":
  main()
