"""Asynchronous single-rollout training vs synchronous batches, same trajectories.

Rollouts are simulated: each takes a long-tailed (log-normal) time standing for
generation plus tool latency, and yields a trajectory of long-tailed length
(a sleep, so rollout "work" does not compete with the learner for the CPU, as
on a real deployment where samplers own their own chips). The learner is real:
the jitted SAO step on a small Qwen3, fed through the real transport and grain
pipeline.

(a) sync: for each batch, start its `batch` rollouts at once, wait for the
    slowest, then train (the GRPO/verl-style round; more slots cannot help it,
    since a round holds one batch).
(b) async: a sampler process keeps `slots` rollouts in flight and streams each
    finished trajectory through a QueueTransport; the learner trains as soon as
    `batch` have arrived (docs/algorithm.md §1). Run twice: with `batch` slots (the same
    rollout concurrency as sync) and with `--slots` (default 64: enough rollout
    capacity to keep the learner busy, as a deployment would provision).

All train the same number of batches. Prints wall-clock, speed-ups and the
learner's idle fraction (time spent waiting for data / wall-clock), then

    RESULT {"name": "async_vs_sync", "speedup_async_vs_sync": ..., "learner_idle_fraction": ...,
            "speedup_equal_slots": ..., "learner_idle_equal_slots": ...}

where the first two keys are for `--slots` and the last two for equal slots.

    .venv/bin/python benchmarks/async_vs_sync.py [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import time

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax import config as C
from sao_jax.channel.transport import QueueTransport, TransportClosed
from sao_jax.data import pipeline
from sao_jax.learner import compile as compile_lib
from sao_jax.sharding.mesh import make_mesh
from sao_jax.types import Trajectory

BUCKETS = (128, 256)


def rollout(index: int, seed: int, mean_s: float, max_length: int = BUCKETS[-1]) -> Trajectory:
  """One simulated rollout: sleeps a log-normal time, returns a valid trajectory."""
  rng = np.random.default_rng([seed, index])
  if mean_s > 0:
    time.sleep(float(rng.lognormal(np.log(mean_s) - 0.5, 1.0)))  # mean ~ mean_s, long tail
  length = int(np.clip(rng.lognormal(np.log(80), 0.5), 24, max_length))
  action = (rng.random(length) < 0.6).astype(np.int8)
  action[:8] = 0
  action[-1] = 1
  rewards = np.zeros(length, np.float32)
  rewards[-1] = float(rng.integers(0, 2))
  return Trajectory(tokens=rng.integers(0, 256, length).astype(np.int32), action_mask=action,
                    behavior_logp=np.where(action, -5.5, 0.0).astype(np.float32),
                    rewards=rewards, prompt_id=index % 64, policy_versions=(0, 0))


def sampler_process(transport, slots: int, seed: int, mean_s: float) -> None:
  with concurrent.futures.ThreadPoolExecutor(slots) as pool:
    futures = {pool.submit(rollout, i, seed, mean_s) for i in range(slots)}
    started = slots
    while futures:
      done, futures = concurrent.futures.wait(futures, return_when="FIRST_COMPLETED")
      for future in done:
        try:
          transport.put(future.result())
        except TransportClosed:
          return
        futures.add(pool.submit(rollout, started, seed, mean_s))
        started += 1


def make_config(batch: int) -> C.Config:
  model = C.ModelConfig(vocab_size=256, hidden_size=128, intermediate_size=384,
                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32, logits_chunk=128)
  return C.Config(model=model, mesh=C.MeshConfig(fsdp=1),
                  learner=C.LearnerConfig(batch_trajectories=batch, critic_warmup_steps=0,
                                          policy_lr=1e-5, value_lr=1e-5),
                  data=C.DataConfig(length_buckets=BUCKETS, max_lag=10**6)).validate()


class Learner:
  """The real compiled step for every bucket, warmed up before timing."""

  def __init__(self, cfg: C.Config):
    self.cfg, self.mesh = cfg, make_mesh(cfg.mesh, jax.devices()[:1])
    self.state = compile_lib.init_sharded_state(cfg, self.mesh, jax.random.key(0))
    self.steps = {t: (compile_lib.compile_train_step(cfg, self.mesh, t),
                      compile_lib.batch_shardings(cfg, self.mesh, t)) for t in BUCKETS}
    for t in BUCKETS:  # compile outside the timed region
      rows = [rollout(i, 0, 0.0, max_length=t) for i in range(cfg.learner.batch_trajectories)]
      self.train(pipeline.pad_batch(rows, cfg.learner.batch_trajectories, t, 0))

  def train(self, batch) -> None:
    step, shardings = self.steps[batch.shape[1]]
    self.state, metrics = step(self.state, compile_lib.put_batch(batch, shardings),
                               jnp.asarray(True))
    jax.block_until_ready(metrics)


def run_sync(learner: Learner, batches: int, slots: int, seed: int, mean_s: float):
  """`slots` concurrent rollouts per round (a round holds one batch)."""
  size = learner.cfg.learner.batch_trajectories
  idle, start = 0.0, time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(slots) as pool:
    for b in range(batches):
      wait_start = time.perf_counter()
      rows = list(pool.map(lambda i: rollout(i, seed, mean_s), range(b * size, (b + 1) * size)))
      length = next(t for t in BUCKETS if t >= max(r.length for r in rows))
      idle += time.perf_counter() - wait_start
      learner.train(pipeline.pad_batch(rows, size, length, 0))
  return time.perf_counter() - start, idle


def run_async(learner: Learner, batches: int, slots: int, seed: int, mean_s: float):
  cfg = learner.cfg
  transport = QueueTransport(capacity=4 * cfg.learner.batch_trajectories)
  process = multiprocessing.get_context("spawn").Process(
      target=sampler_process, args=(transport, slots, seed, mean_s), daemon=True)
  drops = pipeline.Drops()
  it = pipeline.learner_pipeline(transport, batch_size=cfg.learner.batch_trajectories,
                                 group_size=1, max_lag=cfg.data.max_lag, buckets=BUCKETS,
                                 pad_id=0, vocab_size=256, current_version=lambda: 0, drops=drops)
  process.start()
  time.sleep(1.0)  # interpreter start-up of the sampler process is not rollout time
  idle, start = 0.0, time.perf_counter()
  for _ in range(batches):
    wait_start = time.perf_counter()
    batch, _ = next(it)
    idle += time.perf_counter() - wait_start
    learner.train(batch)
  elapsed = time.perf_counter() - start
  transport.close()
  process.join(10)
  if process.is_alive():
    process.terminate()
  assert not drops, f"unexpected drops {dict(drops)}"
  return elapsed, idle


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--slots", type=int, default=64, help="concurrent rollouts")
  parser.add_argument("--mean-rollout-s", type=float, default=1.0)
  args = parser.parse_args()
  batches = 4 if args.quick else 12
  learner = Learner(make_config(args.batch))
  t0 = time.perf_counter()
  learner.train(pipeline.pad_batch([rollout(i, 1, 0.0, max_length=BUCKETS[0])
                                    for i in range(args.batch)], args.batch, BUCKETS[0], 0))
  step_s = time.perf_counter() - t0
  runs = {"sync": run_sync(learner, batches, args.batch, seed=1, mean_s=args.mean_rollout_s),
          f"async {args.batch} slots": run_async(learner, batches, args.batch, seed=1,
                                                 mean_s=args.mean_rollout_s),
          f"async {args.slots} slots": run_async(learner, batches, args.slots, seed=1,
                                                 mean_s=args.mean_rollout_s)}
  print(f"{batches * args.batch} trajectories, batch {args.batch}, rollout ~"
        f"{args.mean_rollout_s:g}s (log-normal), learner step {step_s * 1e3:.0f} ms")
  print(f"{'mode':>16} {'wall s':>8} {'learner idle':>13} {'speed-up':>9}")
  sync_s = runs["sync"][0]
  for mode, (wall, idle) in runs.items():
    print(f"{mode:>16} {wall:>8.2f} {idle / wall:>13.1%} {sync_s / wall:>8.2f}x")
  (eq_s, eq_idle), (many_s, many_idle) = list(runs.values())[1:]
  print("RESULT " + json.dumps({"name": "async_vs_sync",
                                "speedup_async_vs_sync": round(sync_s / many_s, 2),
                                "learner_idle_fraction": round(many_idle / many_s, 3),
                                "speedup_equal_slots": round(sync_s / eq_s, 2),
                                "learner_idle_equal_slots": round(eq_idle / eq_s, 3),
                                "sync_idle_fraction": round(runs["sync"][1] / sync_s, 3),
                                "trajectories": batches * args.batch}))


if __name__ == "__main__":
  main()
