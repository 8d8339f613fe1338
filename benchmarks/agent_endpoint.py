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

The programs are Python functions, so they run in the sampler's process: their openai
clients' CPU competes with the engine's. `--client shared` (the default) builds each
episode's `openai.OpenAI` on one process-wide http client, as the tutorial advises for
function programs; `--client per-episode` gives each its own, whose construction loads
the CA bundle into a fresh SSL context (tens of ms of CPU per episode, more than the
episode's decoding of this tiny model on a loaded CPU). The two modes run `--repeats`
times, interleaved (the order alternating), so that a shared machine's load drifts over
both; the figures are the medians over the repeats.

RESULT keys: `tokens_per_s_ratio` = endpoint sampled tokens/s over in-process, the median
of the repeats' ratios (target >= 0.8; `ratios` lists them); `per_call_overhead_ms` = the
endpoint run's extra wall time over the in-process run's, per call, times the episodes in
flight together (what a call costs its episode beyond the in-process turn);
`mean_call_ms` what a client waited per call; `cpu_ms_per_call` the process CPU time per
call of each mode (the endpoint's minus the in-process one is what the HTTP path, the
openai client and the program threads cost); `max_abs_logp_diff` between the two runs'
behavior_logp, and `tokens_identical` (the same episode sampled the same tokens in every
run, and the endpoint's returned logprobs equal its recorded behavior_logp).

    .venv/bin/python benchmarks/agent_endpoint.py [--quick] [--repeats 5] [--client per-episode]
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
HTTP: list = [None]  # --client shared: the one http client every episode's openai client uses
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
  client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120,
                         http_client=HTTP[0])
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
  began, cpu = time.perf_counter(), time.process_time()
  done = run_to_completion(runner, iter(tasks), len(tasks), num_slots=1, seed=args.seed)
  seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
  runner.close()
  return {t.info["task"]: t for t in done}, seconds, cpu


def exact(inside, outside, returned) -> tuple[bool, float]:
  """Whether the runs' trajectories are token-identical and the endpoint's returned
  logprobs equal its recorded behavior_logp; the largest |behavior_logp difference|."""
  identical = inside.keys() == outside.keys() and all(
      np.array_equal(inside[k].tokens, outside[k].tokens)
      and np.array_equal(outside[k].behavior_logp[outside[k].action_mask == 1],
                         np.float32(returned[k])) for k in inside)
  diff = max(float(np.max(np.abs(inside[k].behavior_logp - outside[k].behavior_logp)))
             if inside[k].length == outside[k].length else float("inf") for k in inside)
  return identical, diff


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer episodes and repeats")
  parser.add_argument("--episodes", type=int, default=64)
  parser.add_argument("--slots", type=int, default=8)
  parser.add_argument("--turns", type=int, default=3)
  parser.add_argument("--max-latency-s", type=float, default=0.2)
  parser.add_argument("--repeats", type=int, default=5, help="interleaved runs of each mode")
  parser.add_argument("--client", choices=("shared", "per-episode"), default="shared",
                      help="the http client of each episode's openai client (module docstring)")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  if args.quick:
    args.episodes, args.repeats = 16, 2
  ARGS.turns, ARGS.max_latency_s = args.turns, args.max_latency_s
  demo = load_config(ROOT / "configs" / "demo_cpu.py")
  chat = chat_format(None, train_tokenizer([f"task {i}: what is {i} plus 7" for i in range(64)],
                                           vocab_size=demo.model.vocab_size))
  model = dataclasses.replace(demo.model, vocab_size=chat.tokenizer.get_vocab_size())
  sampler = dataclasses.replace(demo.sampler, slots=args.slots, stop_patterns=(),
                                max_new_tokens=24, max_seq_len=384)
  engine = make_engine(sampler, model, init_params(model, jax.random.key(args.seed)), chat)
  engine.warmup()
  import openai  # imported once before timing, as a long-running program has
  if args.client == "shared":
    HTTP[0] = openai.DefaultHttpxClient(timeout=120)
  tasks = [Task(id=f"t{i}", prompt=f"task {i}: what is {i} plus 7", answer="")
           for i in range(args.episodes)]
  calls = args.episodes * args.turns
  sys.modules.setdefault("agent_endpoint", sys.modules[__name__])
  options = agent_spec.AgentOptions(program="agent_endpoint:agent", time_limit_s=120.0)
  makers = {"in_process": InProcess, "endpoint": lambda: agent_spec.make(options, EnvConfig())}
  runs = {"in_process": [], "endpoint": []}
  identical, diff = True, 0.0
  for repeat in range(args.repeats):
    order = list(makers) if repeat % 2 == 0 else list(makers)[::-1]
    done = {}
    RETURNED.clear()
    for mode in order:
      runner = EpisodeRunner(engine, chat, makers[mode], max_episodes=2 * args.slots,
                             env_threads=2 * args.slots, log=print)
      done[mode], seconds, cpu = measure(runner, tasks, args)
      assert not runner.failures, runner.failures
      sampled = sum(int(t.action_mask.sum()) for t in done[mode].values())
      runs[mode].append({"seconds": seconds, "tokens_per_s": sampled / seconds,
                         "cpu_ms_per_call": 1000 * cpu / calls})
      print(f"{repeat}: {mode:>10}: {len(done[mode])} episodes in {seconds:.2f} s, "
            f"{sampled / seconds:.0f} sampled tokens/s, {1000 * cpu / calls:.1f} ms CPU per call",
            flush=True)
    same, worst = exact(done["in_process"], done["endpoint"], RETURNED)
    identical, diff = identical and same, max(diff, worst)

  def median(mode, key):
    return float(np.median([run[key] for run in runs[mode]]))

  ratios = [e["tokens_per_s"] / i["tokens_per_s"] for i, e in zip(runs["in_process"],
                                                                   runs["endpoint"])]
  # The extra wall time each call costs an episode: the runs' difference, spread over the
  # calls, times the episodes that were in flight together.
  overhead_s = ((median("endpoint", "seconds") - median("in_process", "seconds"))
                * min(2 * args.slots, args.episodes) / calls)
  print("RESULT " + json.dumps({
      "name": "agent_endpoint", "episodes": args.episodes, "slots": args.slots,
      "repeats": args.repeats, "client": args.client,
      "tokens_per_s_ratio": round(float(np.median(ratios)), 3),
      "ratios": [round(r, 3) for r in ratios],
      "endpoint_tokens_per_s": round(median("endpoint", "tokens_per_s"), 1),
      "in_process_tokens_per_s": round(median("in_process", "tokens_per_s"), 1),
      "per_call_overhead_ms": round(1000 * overhead_s, 1),
      "mean_call_ms": round(1000 * float(np.mean(CALL_S)), 1),
      "cpu_ms_per_call": {mode: round(median(mode, "cpu_ms_per_call"), 2) for mode in runs},
      "max_abs_logp_diff": diff, "tokens_identical": identical}))


if __name__ == "__main__":
  main()
