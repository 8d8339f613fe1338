"""Throughput of the coding environment alone: scripted agent on generated tasks.

Plays `coding_generator.solution_actions` (view, edit per bug, run the visible
tests, submit: every episode ends with hidden-test grading) on generated tasks
cycling through difficulties 1..5, for about `--seconds` of wall time, with the
default sandbox limits. Task generation is included; no model is involved. Each
test file and each grading runs in its own bubblewrap-isolated interpreter, so
the rate is dominated by interpreter start-up. Prints a per-difficulty table,
and the cost of the isolation itself: `python -I -S -c pass` run N=20 times
directly and under the sandbox's bwrap command line (`bwrap_call_overhead_ms`:
the mean extra milliseconds per call; `bwrap_call_ratio`: wrapped / direct).

Then a short sampler run: a tiny random Qwen3 drives `--slots` coding episodes
through the real engine and `EpisodeRunner` for `--sampler-seconds`; the
fraction of that wall-clock spent inside `env.step` (tool calls, format
reminders, hidden-test grading at the turn budget) is `env_wait_fraction`. A
random policy rarely writes a valid tool call, so its environment time is
mostly grading; a trained agent's would include its tool runs.

Last, bursts of tool calls: `--slots` episodes play their scripted solutions
through `EpisodeRunner` over a stand-in engine whose every step ends every
episode's turn at once (what a decode call does when tool calls finish
together), with `sampler.env_threads` = 1 (one at a time, the runner before)
and = `--slots`; `env_threads_speedup` is the ratio of their episodes/s (the
rollouts are identical, `tests/sampler/test_episode_failures.py`). Bounded by
the cores the sandboxed interpreters start on. Ends with

    RESULT {"name": "coding_env", "episodes_per_s": ..., "tool_calls_per_s": ...,
            "env_wait_fraction": ..., "bwrap_call_overhead_ms": ..., "bwrap_call_ratio": ...,
            "burst_episodes_per_s": ..., "env_threads_speedup": ...}

    .venv/bin/python benchmarks/coding_env.py [--seconds 20] [--sampler-seconds 30]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import jax

from sao_jax import config as C
from sao_jax.chat import chat_format, tool_calls
from sao_jax.config.env import SandboxLimits
from sao_jax.envs.base import play
from sao_jax.envs.coding import env as coding
from sao_jax.envs.coding import generator as coding_generator
from sao_jax.envs.sandbox import bwrap
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.models.transformer import init_params
from sao_jax.sampler.episodes import EpisodeRunner, make_engine, run_to_completion
from sao_jax.sampler.scripted import ScriptedEngine


def scripted_turns(task) -> list[str]:
  """The scripted agent's turns as a ChatML run's policy writes them (fenced calls)."""
  return [tool_calls.render_turn(turn, "fenced")
          for turn in coding_generator.solution_actions(task)]


def env_wait_fraction(seconds: float, slots: int, seed: int) -> tuple[float, int]:
  """(time in env.step / sampler wall-clock, finished episodes) of a short run."""
  tasks = [coding_generator.generate_task(i, seed=seed, difficulty=1) for i in range(4)]
  chat = chat_format(None, train_tokenizer(
      [coding.SYSTEM_PROMPT] + [t.prompt for t in tasks]
      + [a for t in tasks for a in scripted_turns(t)], vocab_size=512))
  model = C.ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, head_dim=16,
                        num_attention_heads=4, num_key_value_heads=2, logits_chunk=256,
                        max_position_embeddings=4096)
  sampler = C.SamplerConfig(slots=slots, max_seq_len=4096, prefill_buckets=(64, 512, 2048),
                            max_new_tokens=32, steps_per_call=8,
                            stop_patterns=(r"```tool[ \t]*\n.*?\n```",))
  engine = make_engine(sampler, model, init_params(model, jax.random.key(seed)), chat)
  engine.warmup()
  in_env = [0.0]

  def make_env():
    env = coding.CodingEnv(max_turns=6, max_observation_chars=600)
    step = env.step

    def timed_step(action):
      began = time.perf_counter()
      try:
        return step(action)
      finally:
        in_env[0] += time.perf_counter() - began

    env.step = timed_step
    return env

  runner = EpisodeRunner(engine, chat, make_env, max_episodes=slots)
  finished, started, begin = 0, 0, time.perf_counter()
  while time.perf_counter() - begin < seconds:
    while runner.in_flight < runner.max_episodes:
      runner.start(tasks[started % len(tasks)], prompt_id=0, seed=started)
      started += 1
    finished += len(runner.step())
  return in_env[0] / (time.perf_counter() - begin), finished


def burst_episodes_per_s(slots: int, seed: int, env_threads: int, rounds: int = 2) -> float:
  """Episodes/s of `slots` scripted coding episodes at a time whose turns all end together."""
  tasks = [coding_generator.generate_task(i, seed=seed, difficulty=2)
           for i in range(slots * rounds)]
  actions = [scripted_turns(task) for task in tasks]
  chat = chat_format(None, train_tokenizer([coding.SYSTEM_PROMPT] + sum(actions, []),
                                           vocab_size=512))
  # Episode ids count from 0 in start order: episode e plays task e's solution.
  engine = ScriptedEngine(chat, lambda e, turn: actions[e][min(turn, len(actions[e]) - 1)])
  runner = EpisodeRunner(engine, chat,
                         lambda: coding.CodingEnv(max_turns=50, max_observation_chars=600),
                         max_episodes=slots, env_threads=env_threads)
  began = time.perf_counter()
  done = run_to_completion(runner, iter(tasks), len(tasks), num_slots=1, seed=seed)
  elapsed = time.perf_counter() - began
  solved = sum(traj.outcome == 1.0 for traj in done)
  if solved != len(tasks):
    raise RuntimeError(f"the scripted agent solved {solved} of {len(tasks)} tasks")
  return len(tasks) / elapsed


def bwrap_overhead(calls: int = 20) -> tuple[float, float]:
  """(mean extra ms per call, wrapped / direct time) of `python -I -S -c pass`."""
  python = os.path.realpath(sys.executable)
  direct = [python, "-I", "-S", "-c", "pass"]
  limits = SandboxLimits()
  with tempfile.TemporaryDirectory(prefix="sao_bench_") as scratch:
    os.chmod(scratch, 0o711)
    wrapped = bwrap.command(direct, mount_points=bwrap.make_mount_points(scratch),
                            work_dir="/sao_bench", copy_from=None,
                            read_only=bwrap.interpreter_paths(), disk_bytes=limits.disk_mb << 20,
                            max_files=limits.max_files, env={"PATH": "/usr/bin:/bin"})
    seconds = []
    for command in (direct, wrapped):
      began = time.perf_counter()
      for _ in range(calls):
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL)
      seconds.append(time.perf_counter() - began)
  return 1000 * (seconds[1] - seconds[0]) / calls, seconds[1] / seconds[0]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seconds", type=float, default=20.0, help="wall-time budget")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--sampler-seconds", type=float, default=30.0)
  parser.add_argument("--slots", type=int, default=4)
  args = parser.parse_args()
  env = coding.CodingEnv(max_turns=50)
  per_difficulty = collections.defaultdict(lambda: [0, 0, 0.0])  # episodes, tool calls, seconds
  start = time.perf_counter()
  index = 0
  while time.perf_counter() - start < args.seconds:
    difficulty = 1 + index % coding_generator.MAX_DIFFICULTY
    began = time.perf_counter()
    task = coding_generator.generate_task(index, seed=args.seed, difficulty=difficulty)
    result = play(env, task, coding_generator.solution_actions(task)).result
    if result.reward != 1.0:
      raise RuntimeError(f"the scripted agent did not solve {task.id}: {result}")
    stats = per_difficulty[difficulty]
    stats[0] += 1
    stats[1] += result.info["tool_calls"]
    stats[2] += time.perf_counter() - began
    index += 1
  elapsed = time.perf_counter() - start
  episodes = sum(s[0] for s in per_difficulty.values())
  tool_calls = sum(s[1] for s in per_difficulty.values())
  print(f"episodes={episodes}  "
        f"tool_calls={tool_calls}  seconds={elapsed:.1f}")
  print(f"{'difficulty':>10} {'episodes':>9} {'ms/episode':>11} {'tool calls/episode':>19}")
  for difficulty, (count, calls, seconds) in sorted(per_difficulty.items()):
    print(f"{difficulty:>10} {count:>9} {1000 * seconds / count:>11.1f} {calls / count:>19.1f}")
  wait, sampled = env_wait_fraction(args.sampler_seconds, args.slots, args.seed)
  print(f"sampler run: {sampled} episodes in {args.sampler_seconds:g} s on {args.slots} slots, "
        f"{wait:.1%} of the time waiting on the environment")
  overhead_ms, ratio = bwrap_overhead()
  print(f"bwrap: +{overhead_ms:.1f} ms per interpreter start ({ratio:.2f}x a direct start)")
  one, many = (burst_episodes_per_s(args.slots, args.seed, threads) for threads in (1, args.slots))
  print(f"tool-call bursts of {args.slots}: {one:.2f} episodes/s one at a time, {many:.2f} on "
        f"{args.slots} threads ({many / one:.2f}x, {os.cpu_count()} cores)")
  print("RESULT " + json.dumps({"name": "coding_env",
                                "episodes_per_s": round(episodes / elapsed, 3),
                                "tool_calls_per_s": round(tool_calls / elapsed, 3),
                                "env_wait_fraction": round(wait, 3),
                                "bwrap_call_overhead_ms": round(overhead_ms, 1),
                                "bwrap_call_ratio": round(ratio, 2),
                                "burst_episodes_per_s": round(many, 3),
                                "env_threads_speedup": round(many / one, 2)}))


if __name__ == "__main__":
  main()
