"""Agent programs through the OpenAI-compatible endpoint vs the in-process runner (issue #51).

The same `--episodes` episodes (same tasks, same seeds) run twice on one engine:

  in_process: an `Environment` whose steps sleep the client-side tool latency and
              answer with the follow-up message (the EpisodeRunner as before);
  endpoint:   `env.name="agent"`: a Python function per episode drives the endpoint
              with the real `openai` client, sleeping the same latency between calls
              and sending the same messages.

Latency is drawn per (episode, turn) from a uniform [0, `--max-latency-s`], the same in
both runs. The policy is the CPU demo's model (configs/demo_cpu.py) with random
weights over a ChatML tokenizer trained here; up to 2 x `--slots` episodes in flight,
a step thread each.

RESULT keys: `tokens_per_s_ratio` = endpoint sampled tokens/s over in-process (target
>= 0.8); `per_call_overhead_ms` = the endpoint run's extra wall time over the
in-process run's, per call, times the episodes in flight together (what a call costs its
episode beyond the in-process turn); `mean_call_ms` what a client waited per call; `max_abs_logp_diff` between the two runs'
behavior_logp, and `tokens_identical` (the same episode sampled the same tokens, and
the endpoint's returned logprobs equal its recorded behavior_logp).

    .venv/bin/python benchmarks/agent_endpoint.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import random
import sys
import time

import jax
import numpy as np

from sao_jax.chat import chat_format
from sao_jax.config import EnvConfig, load_config
from sao_jax.envs.agent import spec as agent_spec
from sao_jax.envs.base import Environment, StepResult, Task
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.models.transformer import init_params
from sao_jax.sampler.episodes import EpisodeRunner, make_engine, run_to_completion

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLLOW_UP = "Say it again."
ARGS = argparse.Namespace(turns=3, max_latency_s=0.2)
RETURNED: dict[str, list[float]] = {}  # task id -> the endpoint's logprobs, call by call
CALL_S: list[float] = []


def latency(task_id: str, turn: int) -> float:
  return random.Random(f"{task_id}/{turn}").uniform(0.0, ARGS.max_latency_s)


def prompt(task: Task) -> list[dict]:
  return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": task.prompt}]


class InProcess(Environment):
  def __init__(self):
    super().__init__(max_turns=ARGS.turns + 1, max_observation_chars=200)

  def _reset(self, task):
    return prompt(task)

  def _step(self, action):
    time.sleep(latency(self.task.id, self.turn))
    if self.turn == ARGS.turns:
      return StepResult.finish(1.0, "done")
    return StepResult.next(FOLLOW_UP)


def agent(task, base_url, api_key):
  """The same conversation through the openai client."""
  import openai
  client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
  messages = prompt(task)
  for turn in range(1, ARGS.turns + 1):
    began = time.perf_counter()
    reply = client.chat.completions.create(model="policy", messages=messages, logprobs=True)
    CALL_S.append(time.perf_counter() - began)
    RETURNED.setdefault(task.id, []).extend(e.logprob for e in reply.choices[0].logprobs.content)
    time.sleep(latency(task.id, turn))
    messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                 {"role": "user", "content": FOLLOW_UP}]
  return 1.0


def measure(runner, tasks, args):
  began = time.perf_counter()
  done = run_to_completion(runner, iter(tasks), len(tasks), num_slots=1, seed=args.seed)
  seconds = time.perf_counter() - began
  runner.close()
  return {t.info["task"]: t for t in done}, seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer episodes")
  parser.add_argument("--episodes", type=int, default=64)
  parser.add_argument("--slots", type=int, default=8)
  parser.add_argument("--turns", type=int, default=3)
  parser.add_argument("--max-latency-s", type=float, default=0.2)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  if args.quick:
    args.episodes = 16
  ARGS.turns, ARGS.max_latency_s = args.turns, args.max_latency_s
  demo = load_config(ROOT / "configs" / "demo_cpu.py")
  chat = chat_format(None, train_tokenizer([f"task {i}: what is {i} plus 7" for i in range(64)],
                                           vocab_size=demo.model.vocab_size))
  model = dataclasses.replace(demo.model, vocab_size=chat.tokenizer.get_vocab_size())
  sampler = dataclasses.replace(demo.sampler, slots=args.slots, stop_patterns=(),
                                max_new_tokens=24, max_seq_len=384)
  engine = make_engine(sampler, model, init_params(model, jax.random.key(args.seed)), chat)
  engine.warmup()
  import openai  # noqa: F401  (imported once before timing, as a long-running program has)
  tasks = [Task(id=f"t{i}", prompt=f"task {i}: what is {i} plus 7", answer="")
           for i in range(args.episodes)]
  sys.modules.setdefault("agent_endpoint", sys.modules[__name__])
  options = agent_spec.AgentOptions(program="agent_endpoint:agent", time_limit_s=120.0)
  runs = {}
  for mode, make in (("in_process", InProcess),
                     ("endpoint", lambda: agent_spec.make(options, EnvConfig()))):
    runner = EpisodeRunner(engine, chat, make, max_episodes=2 * args.slots,
                           env_threads=2 * args.slots, log=print)
    done, seconds = measure(runner, tasks, args)
    assert not runner.failures, runner.failures
    sampled = sum(int(t.action_mask.sum()) for t in done.values())
    runs[mode] = {"done": done, "seconds": seconds, "tokens_per_s": sampled / seconds}
    print(f"{mode:>10}: {len(done)} episodes in {seconds:.1f} s, "
          f"{runs[mode]['tokens_per_s']:.0f} sampled tokens/s", flush=True)
  inside, outside = runs["in_process"]["done"], runs["endpoint"]["done"]
  identical = all(np.array_equal(inside[k].tokens, outside[k].tokens)
                  and np.array_equal(outside[k].behavior_logp[outside[k].action_mask == 1],
                                     np.float32(RETURNED[k])) for k in inside)
  diff = max(float(np.max(np.abs(inside[k].behavior_logp - outside[k].behavior_logp)))
             if inside[k].length == outside[k].length else float("inf") for k in inside)
  # The extra wall time each call costs an episode: the runs' difference, spread over the
  # calls, times the episodes that were in flight together.
  overhead_s = ((runs["endpoint"]["seconds"] - runs["in_process"]["seconds"])
                * min(2 * args.slots, args.episodes) / (args.episodes * args.turns))
  print("RESULT " + json.dumps({
      "name": "agent_endpoint", "episodes": args.episodes, "slots": args.slots,
      "tokens_per_s_ratio": round(runs["endpoint"]["tokens_per_s"]
                                  / runs["in_process"]["tokens_per_s"], 3),
      "endpoint_tokens_per_s": round(runs["endpoint"]["tokens_per_s"], 1),
      "in_process_tokens_per_s": round(runs["in_process"]["tokens_per_s"], 1),
      "per_call_overhead_ms": round(1000 * overhead_s, 1),
      "mean_call_ms": round(1000 * float(np.mean(CALL_S)), 1),
      "max_abs_logp_diff": diff, "tokens_identical": identical}))


if __name__ == "__main__":
  main()
