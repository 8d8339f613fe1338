"""Throughput of the jitted policy forward+backward on CPU, against a matmul roofline.

  .venv/bin/python benchmarks/forward.py [--batch 2 --seq 128 --steps 3]

Model: a ~100M-parameter dense Qwen3 config (12 layers, hidden 768, vocab
32768, tied embeddings). The loss is sum(logp) over all tokens, i.e. what the
policy update differentiates. FLOPs per step are counted analytically
(6 * matmul params * tokens for forward+backward, plus attention and the LM head)
and compared with the FLOP/s of a large float32 `jnp.dot` timed in the same run.
The last line is `RESULT {json}` for the side-by-side tables.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp

from sao_jax.config import ModelConfig
from sao_jax.models import forward, transformer

CFG = ModelConfig(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                  tie_word_embeddings=True, logits_chunk=128)


def _timed(fn, *args, steps: int) -> float:
  """Mean seconds per call over `steps` calls, after one warm-up (compile) call."""
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  for _ in range(steps):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / steps


def matmul_flops_per_s(n: int = 2048, steps: int = 3) -> float:
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  return 2 * n**3 / _timed(jax.jit(jnp.dot), a, b, steps=steps)


def step_flops(cfg: ModelConfig, batch: int, seq: int) -> float:
  """Forward+backward FLOPs: 3 x forward, forward = 2 * matmul MACs."""
  d, f, n, k, h = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                   cfg.num_key_value_heads, cfg.head_dim)
  per_token_layer = d * (n + 2 * k) * h + n * h * d + 3 * d * f + 2 * n * h * seq  # proj + mlp + attn
  per_token = cfg.num_hidden_layers * per_token_layer + d * cfg.vocab_size
  return 3 * 2 * per_token * batch * seq


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--steps", type=int, default=3)
  args = parser.parse_args()

  roofline = matmul_flops_per_s()
  params = transformer.init_params(CFG, jax.random.key(0))
  n_params = sum(x.size for x in jax.tree.leaves(params))
  tokens = jax.random.randint(jax.random.key(1), (args.batch, args.seq), 0, CFG.vocab_size)
  mask = jnp.ones(tokens.shape, jnp.int32)
  loss = lambda p: jnp.sum(forward.policy_forward(p, CFG, tokens, mask).logp_BxT)
  step = jax.jit(jax.value_and_grad(loss))
  start = time.perf_counter()
  jax.block_until_ready(step(params))
  compile_s = time.perf_counter() - start
  seconds = _timed(step, params, steps=args.steps)
  tokens_per_s = args.batch * args.seq / seconds
  achieved = step_flops(CFG, args.batch, args.seq) / seconds
  rows = [("params", f"{n_params / 1e6:.1f}M"), ("batch x seq", f"{args.batch} x {args.seq}"),
          ("compile+first step", f"{compile_s:.1f} s"), ("step", f"{seconds * 1e3:.0f} ms"),
          ("tokens/s", f"{tokens_per_s:.0f}"), ("achieved", f"{achieved / 1e9:.1f} GFLOP/s"),
          ("matmul roofline", f"{roofline / 1e9:.1f} GFLOP/s"),
          ("fraction", f"{achieved / roofline:.2f}")]
  for name, value in rows:
    print(f"{name:>20}  {value}")
  print("RESULT " + json.dumps({"name": "forward", "tokens_per_s": round(tokens_per_s, 1),
                                "roofline_fraction": round(achieved / roofline, 3)}))


if __name__ == "__main__":
  main()
