"""Environment steps overlapping generation vs the blocking runner (issue #41).

A scripted environment answers each turn after a long-tailed latency, a sleep
drawn from a log-normal with median `--median-s` (0.5 s) and p99 `--p99-s`
(10 s), the same draw for the same (episode, turn) in every run. The policy is
the CPU demo's model (configs/demo_cpu.py) with random weights (its turns run
to `max_new_tokens`), on the paged engine with `--slots` decode slots; up to
`--episodes-per-slot` x slots episodes are in flight (the waiting ones give up
their slots, and their continuations re-prefill), with one step thread per
episode (the steps sleep). Three runs of `--seconds` each:

  instant:  the overlapped runner, environments answering at once (the decode ceiling)
  overlap:  the overlapped runner at the latency mix
  blocking: the runner before (overlap=False: each engine step waits for the
            environment steps of the turns it ended) at the same mix

RESULT keys: `decode_ratio_with_env_latency` = overlap's sampled tokens/s over
instant's; `episodes_per_s_vs_blocking` = overlap's finished episodes/s over
blocking's; `engine_idle_on_env_fraction` = the share of overlap's wall time
the runner sat waiting on environments with nothing to decode.

    .venv/bin/python benchmarks/env_overlap.py [--quick]

Measured (2 quiet cores, `--seconds 40`, 2026-12-07): instant 4245 sampled tokens/s,
overlap 3777 (38.2 episodes/s, never waiting on an environment), blocking 71
(0.75 episodes/s, waiting 98.2% of the time): RESULT decode_ratio 0.890,
episodes_per_s_vs_blocking 50.9, engine_idle_on_env_fraction 0.0 (an earlier run on
2 loaded cores: 0.993, 36.5, 0.0).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import random
import time
import types

import jax

from sao_jax.chat import chat_format
from sao_jax.config import load_config
from sao_jax.envs.base import Environment, StepResult, Task
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.models.transformer import init_params
from sao_jax.sampler.episodes import EpisodeRunner, make_engine

ROOT = pathlib.Path(__file__).resolve().parents[1]
Z99 = 2.3263  # the standard normal's 99th percentile


class LatencyEnv(Environment):
  """`turns` turns; every step sleeps a log-normal time (module docstring) first."""

  def __init__(self, *, turns: int, mu: float, sigma: float, seed: int, instant: bool):
    super().__init__(max_turns=turns, max_observation_chars=200)
    self._mu, self._sigma, self._seed, self._instant = mu, sigma, seed, instant

  def _reset(self, task):
    return [{"role": "user", "content": task.prompt}]

  def _step(self, action):
    if not self._instant:
      draw = random.Random(f"{self._seed}/{self.task.id}/{self.turn}")
      time.sleep(draw.lognormvariate(self._mu, self._sigma))
    if self.turn == self.max_turns:
      return StepResult.finish(float(len(action) % 2), "answer")
    return StepResult.next(f"tool output {self.turn}: {len(action)} characters read")


def measure(mode: str, args, engine, chat) -> dict:
  """Runs `mode` for `args.seconds`; its sampled tokens/s, episodes/s, wait share."""
  mu, sigma = math.log(args.median_s), math.log(args.p99_s / args.median_s) / Z99
  max_episodes = args.episodes_per_slot * args.slots
  make_env = lambda: LatencyEnv(turns=args.turns, mu=mu, sigma=sigma, seed=args.seed,
                                instant=mode == "instant")
  runner = EpisodeRunner(engine, chat, make_env, max_episodes=max_episodes,
                         env_threads=max_episodes, overlap=mode != "blocking",
                         log=lambda text: None)
  before = dict(engine.stats)
  finished = started = 0
  begin = time.perf_counter()
  try:
    while time.perf_counter() - begin < args.seconds:
      while runner.can_start():
        task = Task(id=f"{mode}-{started}", prompt=f"task {started}: add {started} and 7",
                    answer="", metadata=types.MappingProxyType({}))
        runner.start(task, prompt_id=0, seed=args.seed + started)
        started += 1
      finished += len(runner.step())
    wall = time.perf_counter() - begin
  finally:
    runner.close()
  stats = {key: engine.stats[key] - before.get(key, 0) for key in engine.stats}
  return {"mode": mode, "seconds": round(wall, 1), "episodes": finished,
          "episodes_per_s": finished / wall, "tokens_per_s": stats["sampled_tokens"] / wall,
          "env_wait_fraction": runner.env_wait_s / wall,
          # Sampled tokens per slot-step of decoding: the share of slots doing useful work.
          "occupancy": stats["sampled_tokens"] / max(stats["decode_steps"] * args.slots, 1),
          "decode_calls_per_s": stats["decode_calls"] / wall,
          "prefill_calls_per_s": stats["prefill_calls"] / wall}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seconds", type=float, default=60.0, help="wall time per run")
  parser.add_argument("--quick", action="store_true", help="20 s per run")
  parser.add_argument("--slots", type=int, default=16)
  parser.add_argument("--episodes-per-slot", type=int, default=24)
  parser.add_argument("--turns", type=int, default=3)
  parser.add_argument("--median-s", type=float, default=0.5)
  parser.add_argument("--p99-s", type=float, default=10.0)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  if args.quick:
    args.seconds = 20.0
  demo = load_config(ROOT / "configs" / "demo_cpu.py")
  chat = chat_format(None, train_tokenizer(
      [f"task {i}: add {i} and 7 tool output characters read" for i in range(64)],
      vocab_size=demo.model.vocab_size))
  model = dataclasses.replace(demo.model, vocab_size=chat.tokenizer.get_vocab_size())
  sampler = dataclasses.replace(demo.sampler, slots=args.slots, stop_patterns=(),
                                max_new_tokens=32)
  engine = make_engine(sampler, model, init_params(model, jax.random.key(args.seed)), chat)
  began = time.perf_counter()
  engine.warmup()
  print(f"warmup {time.perf_counter() - began:.1f} s; {args.slots} slots, up to "
        f"{args.episodes_per_slot * args.slots} episodes in flight, {args.turns} turns of "
        f"{sampler.max_new_tokens} tokens, step latency log-normal median {args.median_s} s "
        f"p99 {args.p99_s} s", flush=True)
  runs = {}
  for mode in ("instant", "overlap", "blocking"):
    runs[mode] = measure(mode, args, engine, chat)
    run = runs[mode]
    print(f"{mode:>9}: {run['episodes']:4d} episodes in {run['seconds']} s, "
          f"{run['episodes_per_s']:.2f} episodes/s, {run['tokens_per_s']:.0f} sampled tokens/s, "
          f"waiting on environments {run['env_wait_fraction']:.1%} of the time; "
          f"{run['decode_calls_per_s']:.1f} decode and {run['prefill_calls_per_s']:.1f} prefill "
          f"calls/s, slot occupancy {run['occupancy']:.0%}", flush=True)
  overlap, instant, blocking = runs["overlap"], runs["instant"], runs["blocking"]
  if not blocking["episodes"]:
    raise SystemExit("the blocking runner finished no episode: raise --seconds")
  print("RESULT " + json.dumps({
      "name": "env_overlap",
      "decode_ratio_with_env_latency": round(overlap["tokens_per_s"] / instant["tokens_per_s"], 3),
      "episodes_per_s_vs_blocking": round(overlap["episodes_per_s"]
                                          / blocking["episodes_per_s"], 2),
      "engine_idle_on_env_fraction": round(overlap["env_wait_fraction"], 3)}))


if __name__ == "__main__":
  main()
