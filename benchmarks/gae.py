"""GAE throughput: a reverse numpy loop (how verl computes GAE) vs our two paths.

For each B x T the loop runs the skip-observation recurrence token by token in
Python/numpy, then our jitted `lax.scan` reference and our default
`associative_scan` path run on the same arrays (compile excluded, best of
several runs). Prints a table of times and speed-ups and ends with

    RESULT {"name": "gae", "speedup_vs_loop_65536": ..., ...}

where `speedup_vs_loop_65536` is the default path (`method="auto"`: scan on
CPU, associative on accelerators) vs the loop at 4 x 65536.

    .venv/bin/python benchmarks/gae.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from sao_jax import losses


def numpy_loop_gae(rewards, values, mask, gamma, lam_B):
  """Token-by-token reverse loop over [B, T], vectorised over the batch like verl."""
  batch, length = rewards.shape
  advantages = np.zeros_like(rewards)
  next_value = np.zeros(batch, rewards.dtype)
  next_adv = np.zeros(batch, rewards.dtype)
  for t in reversed(range(length)):
    m = mask[:, t]
    delta = rewards[:, t] + gamma * next_value - values[:, t]
    adv = delta + gamma * lam_B * next_adv
    next_value = np.where(m, values[:, t], next_value)
    next_adv = np.where(m, adv, next_adv)
    advantages[:, t] = np.where(m, adv, 0.0)
  return advantages


def best_time(fn, repeats):
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return best


def make_inputs(batch, length, seed=0):
  rng = np.random.default_rng(seed)
  mask = rng.random((batch, length)) < 0.4  # agent traces: mostly observation tokens
  values = rng.uniform(0, 1, (batch, length)).astype(np.float32)
  rewards = np.zeros((batch, length), np.float32)
  rewards[:, -1] = 1.0
  mask[:, -1] = True
  return rewards, values, mask


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer repeats")
  args = parser.parse_args()
  shapes = [(8, 1024), (4, 4096)] if args.quick else [(8, 8192), (4, 65536), (1, 131072)]
  repeats = 2 if args.quick else 5
  run = jax.jit(losses.gae, static_argnames="method")
  result = {"name": "gae", "device": jax.devices()[0].platform}
  print(f"{'B x T':>12} {'loop s':>10} {'scan s':>10} {'assoc s':>10} "
        f"{'scan x':>8} {'assoc x':>8} {'auto x':>8} {'max|diff|':>10}")
  for batch, length in shapes:
    rewards, values, mask = make_inputs(batch, length)
    lam_B = np.asarray(losses.length_adaptive_lam(mask, alpha=1.5))
    args_ = (rewards, values, mask)
    loop_s = best_time(lambda: numpy_loop_gae(*args_, 1.0, lam_B), max(1, repeats // 2))
    times = {}
    for method in ("scan", "associative", "auto"):
      jax.block_until_ready(run(*args_, gamma=1.0, lam=lam_B, method=method))  # compile
      times[method] = best_time(lambda: run(*args_, gamma=1.0, lam=lam_B, method=method),
                                repeats)
    diff = np.abs(np.asarray(run(*args_, gamma=1.0, lam=lam_B)[0])
                  - numpy_loop_gae(*args_, 1.0, lam_B)).max()
    speed = {method: loop_s / t for method, t in times.items()}
    print(f"{batch:>4} x {length:<6} {loop_s:>10.4f} {times['scan']:>10.4f} "
          f"{times['associative']:>10.4f} {speed['scan']:>8.1f} {speed['associative']:>8.1f} "
          f"{speed['auto']:>8.1f} {diff:>10.2e}")
    result[f"speedup_vs_loop_{length}"] = round(speed["auto"], 1)
    result[f"scan_speedup_vs_loop_{length}"] = round(speed["scan"], 1)
    result[f"assoc_speedup_vs_loop_{length}"] = round(speed["associative"], 1)
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
