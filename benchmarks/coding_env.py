"""Throughput of the coding environment alone: scripted agent on generated tasks.

Plays `coding_generator.solution_actions` (view, edit per bug, run the visible
tests, submit: every episode ends with hidden-test grading) on generated tasks
cycling through difficulties 1..5, for about `--seconds` of wall time, with the
default sandbox limits. Task generation is included; no model is involved. Each
test file runs in its own sandboxed interpreter, so the rate is dominated by
interpreter start-up (`namespaces` in the output says whether the root-only
namespace isolation was in use). Prints a per-difficulty table and ends with

    RESULT {"name": "coding_env", "episodes_per_s": ..., "tool_calls_per_s": ...}

    .venv/bin/python benchmarks/coding_env.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import time

from sao_jax.envs import coding, coding_generator, sandbox
from sao_jax.envs.base import play


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seconds", type=float, default=20.0, help="wall-time budget")
  parser.add_argument("--seed", type=int, default=0)
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
  print(f"namespaces={sandbox.namespaces_available()}  episodes={episodes}  "
        f"tool_calls={tool_calls}  seconds={elapsed:.1f}")
  print(f"{'difficulty':>10} {'episodes':>9} {'ms/episode':>11} {'tool calls/episode':>19}")
  for difficulty, (count, calls, seconds) in sorted(per_difficulty.items()):
    print(f"{difficulty:>10} {count:>9} {1000 * seconds / count:>11.1f} {calls / count:>19.1f}")
  print("RESULT " + json.dumps({"name": "coding_env",
                                "episodes_per_s": round(episodes / elapsed, 3),
                                "tool_calls_per_s": round(tool_calls / elapsed, 3)}))


if __name__ == "__main__":
  main()
