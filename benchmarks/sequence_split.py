"""Learner tokens/s and peak memory per device against sequence length, with and without
the mesh's sequence axis, on emulated CPU devices.

  .venv/bin/python benchmarks/sequence_split.py [--lengths 512 1024 2048 4096]
      [--rows 2] [--shards 4] [--steps 2] [--small]

One full SAO step (`sao_jax.learner.compile.compile_train_step`: value forward,
GAE, one DIS policy update, K=2 value updates) on `benchmarks/learner.py`'s
synthetic batch of `--rows` trajectories, one per row, for a small dense model
(blocked attention and full remat in both runs, as a long-context run has them):

  * without the axis: mesh fsdp=rows over `--rows` devices, one whole sequence
    per device;
  * with it: mesh fsdp=rows x sequence=shards over rows x shards devices, each
    sequence split over `--shards` devices (`docs/explanation/long-episodes.md`).

Per length: per-device peak from the compiled step's `memory_analysis()`
(arguments + outputs - aliased + temporaries, as benchmarks/learner.py), and
tokens/s as the median of `--steps` timed steps after a warm-up.
memory_ratio = split / unsplit peak per device (at long lengths it tends to
1 / shards plus the gathered keys and values); throughput_ratio = split /
unsplit tokens/s. Emulated CPU devices share the host's cores, so the
throughput ratio measures the split's overhead (reorders, all-gathers, the
chunked GAE), not a speed-up; per-device memory is the figure that carries over
to TPU. The last line is `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from learner import compile_step, peak_bytes, synthetic_batch
from sao_jax.config import Config, LearnerConfig, MeshConfig, ModelConfig
from sao_jax.learner import compile as compile_lib
from sao_jax.sharding.mesh import make_mesh

MODEL = ModelConfig(vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                    tie_word_embeddings=True, logits_chunk=128, attention_impl="blocked",
                    attention_block=128, remat_policy="full")
SMALL_MODEL = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          tie_word_embeddings=True, logits_chunk=32, attention_impl="blocked",
                          attention_block=32, remat_policy="full")


def measure(cfg: Config, mesh_cfg: MeshConfig, devices, seq: int, steps: int) -> dict:
  """Per-device peak (GiB) and tokens/s of the step on `mesh_cfg` at length `seq`."""
  mesh = make_mesh(mesh_cfg, devices)
  batch = synthetic_batch(cfg, seq)
  compiled = compile_step(cfg, mesh, batch)
  peak, _ = peak_bytes(cfg, mesh, compiled)
  state = compile_lib.init_sharded_state(cfg, mesh, jax.random.key(0))
  device_batch = compile_lib.put_batch(batch, compile_lib.batch_shardings(cfg, mesh, seq))
  update_policy = jnp.asarray(True)
  state, metrics = compiled(state, device_batch, update_policy)  # warm-up
  jax.block_until_ready(metrics)
  seconds = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = compiled(state, device_batch, update_policy)
    jax.block_until_ready(metrics)
    seconds.append(time.perf_counter() - start)
  assert int(state.policy_version) == steps + 1, "a policy update was skipped"
  return {"peak_gib": peak / 2**30, "tokens_per_s": batch.tokens.size / statistics.median(seconds),
          "loss": float(metrics["policy/loss"])}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
  parser.add_argument("--rows", type=int, default=2, help="trajectories (one per row)")
  parser.add_argument("--shards", type=int, default=4, help="mesh.sequence of the split run")
  parser.add_argument("--steps", type=int, default=2)
  parser.add_argument("--small", action="store_true", help="tiny model, short lengths")
  args = parser.parse_args()
  devices_needed = args.rows * args.shards
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", devices_needed)
  if args.small:
    args.lengths, args.steps = [64, 128], 1
  cfg = Config(model=SMALL_MODEL if args.small else MODEL,
               learner=LearnerConfig(batch_trajectories=args.rows)).validate()
  devices = jax.devices()
  runs = {"unsplit": (MeshConfig(fsdp=args.rows), devices[:args.rows]),
          "split": (MeshConfig(fsdp=args.rows, sequence=args.shards), devices[:devices_needed])}
  table = {name: [] for name in runs}
  for seq in args.lengths:
    for name, (mesh_cfg, mesh_devices) in runs.items():
      table[name].append(measure(cfg, mesh_cfg, mesh_devices, seq, args.steps))
  print(f"{'length':>8} {'unsplit GiB':>12} {'split GiB':>10} {'mem ratio':>10} "
        f"{'unsplit tok/s':>14} {'split tok/s':>12} {'tok/s ratio':>12} {'loss diff':>10}")
  memory_ratio, throughput_ratio = [], []
  for i, seq in enumerate(args.lengths):
    one, split = table["unsplit"][i], table["split"][i]
    memory_ratio.append(round(split["peak_gib"] / one["peak_gib"], 3))
    throughput_ratio.append(round(split["tokens_per_s"] / one["tokens_per_s"], 3))
    print(f"{seq:>8} {one['peak_gib']:>12.4f} {split['peak_gib']:>10.4f} {memory_ratio[-1]:>10.3f} "
          f"{one['tokens_per_s']:>14.0f} {split['tokens_per_s']:>12.0f} "
          f"{throughput_ratio[-1]:>12.3f} {abs(one['loss'] - split['loss']):>10.2e}")
  result = {"name": "sequence_split", "platform": devices[0].platform, "rows": args.rows,
            "shards": args.shards, "lengths": args.lengths,
            "peak_gib_per_device": {k: [round(r["peak_gib"], 4) for r in v]
                                    for k, v in table.items()},
            "tokens_per_s": {k: [round(r["tokens_per_s"], 1) for r in v] for k, v in table.items()},
            "memory_ratio": memory_ratio, "throughput_ratio": throughput_ratio,
            # The split step must train the same: |policy loss, split - unsplit| per length.
            "policy_loss_diff": [abs(one["loss"] - split["loss"])
                                 for one, split in zip(table["unsplit"], table["split"])]}
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
