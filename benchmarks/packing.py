"""Sequence packing vs padding: useful (non-padding) tokens per second of the learner.

  .venv/bin/python benchmarks/packing.py [--trajectories 64]

One stream of trajectories with long-tailed lengths (log-normal, median ~150
tokens, clipped to [16, 1024]: most short, a few near the longest bucket) goes
through the learner's real pipeline twice, on one CPU device:

  * padded: `batch_trajectories=8` rows, right-padded to the smallest of the
    length buckets (256, 1024) that fits the batch's longest trajectory;
  * packed: `learner.batch_tokens=4096`, `row_length=1024`: 4 rows, trajectories
    packed first-fit (at most 64 per batch).

Each batch runs one full SAO step (`compile_train_step`: value forward, GAE, one
DIS policy update, K=2 value updates) of a small dense model with blocked
attention (block 128; packing lets it skip block pairs across trajectories).
Every distinct batch shape is compiled and run once before timing, so the time
is steps only. Useful tokens/s = real tokens of all batches / summed step time;
the ratio packed / padded is what packing buys on this length mix (the padding
fractions are printed too). The last line is `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.config import Config, LearnerConfig, MeshConfig, ModelConfig
from sao_jax.data import pipeline
from sao_jax.learner import compile as compile_lib
from sao_jax.sharding.mesh import make_mesh
from sao_jax.types import Trajectory

MODEL = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32, logits_chunk=256,
                    attention_impl="blocked", attention_block=128)
BUCKETS = (256, 1024)
ROW_LENGTH, BATCH_TOKENS, PADDED_ROWS, PACKED_CAP = 1024, 4096, 8, 64


def long_tailed_stream(count: int, seed: int = 0) -> list[Trajectory]:
  """`count` trajectories: 10% prompt, then action tokens, a 0/1 outcome at the end."""
  rng = np.random.default_rng(seed)
  lengths = np.clip(rng.lognormal(np.log(150), 0.8, count), 16, ROW_LENGTH).astype(int)
  trajs = []
  for i, n in enumerate(lengths):
    action = (np.arange(n) >= max(1, n // 10)).astype(np.int8)
    logp = np.where(action, -np.log(MODEL.vocab_size) + 0.1 * rng.standard_normal(n), 0.0)
    rewards = np.zeros(n, np.float32)
    rewards[-1] = rng.integers(0, 2)
    trajs.append(Trajectory(tokens=rng.integers(0, MODEL.vocab_size, n).astype(np.int32),
                            action_mask=action, behavior_logp=logp.astype(np.float32),
                            rewards=rewards, prompt_id=i, policy_versions=(0, 0)))
  return trajs


class ListTransport:
  """The stream as a transport that is closed once drained."""

  closed = True

  def __init__(self, trajs: list[Trajectory]):
    self._trajs = list(trajs)

  def get(self, timeout: float = 0.0) -> Trajectory | None:
    return self._trajs.pop(0) if self._trajs else None


def batches(cfg: Config, trajs: list[Trajectory]) -> list[tuple]:
  it = pipeline.learner_pipeline(
      ListTransport(trajs), batch_size=cfg.learner.batch_trajectories, group_size=1,
      max_lag=0, buckets=BUCKETS, pad_id=0, vocab_size=MODEL.vocab_size,
      current_version=lambda: 0, drops=pipeline.Drops(),
      batch_tokens=cfg.learner.batch_tokens, row_length=cfg.learner.row_length)
  return list(it)


def useful_tokens_per_s(cfg: Config, trajs: list[Trajectory]) -> tuple[float, dict]:
  """Real tokens per second of step time over the whole stream, and batch facts."""
  mesh = make_mesh(MeshConfig(fsdp=1), jax.devices()[:1])
  state = compile_lib.init_sharded_state(cfg, mesh, jax.random.key(0))
  steps = {}
  data = []
  for batch, info in batches(cfg, trajs):
    length = batch.shape[1]
    if length not in steps:
      steps[length] = (compile_lib.compile_train_step(cfg, mesh, length),
                       compile_lib.batch_shardings(cfg, mesh, length))
    data.append((length, compile_lib.put_batch(batch, steps[length][1]), info))
  update_policy = jnp.asarray(True)
  first_of_shape = {length: device_batch for length, device_batch, _ in reversed(data)}
  for length, device_batch in first_of_shape.items():  # compile each shape before timing
    state, metrics = steps[length][0](state, device_batch, update_policy)
    jax.block_until_ready(metrics)
  seconds = 0.0
  for length, device_batch, _ in data:
    start = time.perf_counter()
    state, metrics = steps[length][0](state, device_batch, update_policy)
    jax.block_until_ready(metrics)
    seconds += time.perf_counter() - start
  infos = [info for *_, info in data]
  useful = sum(int(np.sum(info.lengths)) for info in infos)
  facts = {"batches": len(infos), "shapes": sorted({tuple(d[1].tokens.shape) for d in data}),
           "useful_tokens": useful, "step_s": seconds,
           "padding_fraction": 1 - useful / sum(info.capacity for info in infos)}
  return useful / seconds, facts


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trajectories", type=int, default=64)
  args = parser.parse_args()
  jax.config.update("jax_platforms", "cpu")

  trajs = long_tailed_stream(args.trajectories)
  padded_cfg = Config(model=MODEL, learner=LearnerConfig(batch_trajectories=PADDED_ROWS)).validate()
  packed_cfg = Config(model=MODEL, learner=LearnerConfig(
      batch_trajectories=PACKED_CAP, batch_tokens=BATCH_TOKENS, row_length=ROW_LENGTH)).validate()
  lengths = np.array([t.length for t in trajs])
  print(f"{len(trajs)} trajectories: lengths median {np.median(lengths):.0f}, "
        f"p90 {np.percentile(lengths, 90):.0f}, max {lengths.max()}, total {lengths.sum()}")
  results = {}
  for name, cfg in (("padded", padded_cfg), ("packed", packed_cfg)):
    rate, facts = useful_tokens_per_s(cfg, trajs)
    assert facts["useful_tokens"] == lengths.sum(), "every trajectory must be trained on"
    results[name] = rate
    print(f"{name:>7}: {rate:8.0f} useful tokens/s | {facts['batches']} batches of "
          f"{facts['shapes']} | padding {facts['padding_fraction']:.1%} | "
          f"steps {facts['step_s']:.1f} s")
  ratio = results["packed"] / results["padded"]
  print("RESULT " + json.dumps({"name": "packing", "useful_tokens_per_s_ratio": round(ratio, 3),
                                "padded_useful_tokens_per_s": round(results["padded"], 1),
                                "packed_useful_tokens_per_s": round(results["packed"], 1)}))


if __name__ == "__main__":
  main()
