"""Evaluation through the agent endpoint (issue #51 item 6): `sao-eval` scores an agent
program (the report's greedy pass@1, mean@n and pass@k are what the programs' own
rewards make them, computed here from the rewards each program returned), and
`sao-eval --serve` serves a policy alone to clients that open their own episodes."""

import dataclasses
import json
import math
import pathlib
import queue
import threading

import numpy as np
import openai
import pytest

import agent_programs
from conftest import SAMPLER
from sao_jax.config import EnvConfig, load_config
from sao_jax.jobs import evaluate as evaluation, serve

ROOT = pathlib.Path(__file__).resolve().parents[3]
TASKS, SAMPLES = 4, 4


def agent_config(policy, tmp_path, program, **run):
  tasks = tmp_path / "tasks.jsonl"
  tasks.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i} + 3?",
                                       "answer": str(i + 3)}) + "\n" for i in range(TASKS)))
  demo = load_config(ROOT / "configs" / "demo_cpu.py")
  return dataclasses.replace(
      demo, model=policy.model, sampler=dataclasses.replace(SAMPLER, env_threads=8),
      env=EnvConfig(name="agent", task_source="jsonl", jsonl_path=str(tasks), max_turns=2,
                    options={"program": f"agent_programs:{program}", "time_limit_s": 60.0}),
      run=dataclasses.replace(demo.run, run_dir=str(tmp_path / "run"), **run))


def test_benchmark_scores_an_agent_program_by_pass_at_k(policy, tmp_path):
  cfg = agent_config(policy, tmp_path, "even_reply", eval_episodes=TASKS,
                     eval_samples=SAMPLES, eval_pass_k=(1, 2))
  agent_programs.REWARDS.clear()
  report = evaluation.benchmark(cfg, policy.chat, policy.params)
  rewards = agent_programs.REWARDS
  # Each task: one greedy episode, then SAMPLES sampled ones (the sampled phase starts
  # after every greedy episode ended), each a run of the program through the endpoint.
  assert sorted(rewards) == [f"q{i}" for i in range(TASKS)]
  assert all(len(r) == 1 + SAMPLES for r in rewards.values())
  greedy = [r[0] for r in rewards.values()]
  successes = [int(sum(r[1:])) for r in rewards.values()]
  assert 0 < sum(successes) < TASKS * SAMPLES  # the estimator sees both outcomes
  overall = report["overall"]
  assert overall["tasks"] == TASKS and overall["failures"] == 0
  assert overall["greedy_pass@1"] == sum(greedy) / TASKS
  assert math.isclose(overall[f"mean@{SAMPLES}"], sum(successes) / (TASKS * SAMPLES))
  for k in (1, 2):
    expected = sum(1 - math.comb(SAMPLES - c, k) / math.comb(SAMPLES, k)
                   for c in successes) / TASKS
    assert math.isclose(overall[f"pass@{k}"], expected)


def test_a_policy_served_alone_runs_the_episodes_its_clients_open(policy, tmp_path):
  cfg = agent_config(policy, tmp_path, "even_reply")
  endpoints, lines, result = queue.Queue(), [], {}
  server_thread = threading.Thread(target=lambda: result.update(done=serve.serve(
      cfg, policy.chat, policy.params, episodes=2, log=lines.append, ready=endpoints.put)))
  server_thread.start()
  endpoint = endpoints.get(timeout=300)
  client = lambda name: openai.OpenAI(base_url=endpoint.base_url, max_retries=0, timeout=60,
                                      api_key=f"{endpoint.run_token}.{name}")
  # A client names its episode in its key; a name a key cannot carry is refused.
  with pytest.raises(openai.AuthenticationError, match="episode name 'no/slash'"):
    client("no/slash").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}])
  alice = client("alice")
  messages = [{"role": "user", "content": "What is 1 + 1?"}]
  first = alice.chat.completions.create(model="policy", messages=messages, logprobs=True)
  messages += [{"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": "Again."}]
  second = alice.chat.completions.create(model="policy", messages=messages, logprobs=True)
  alice.post("/episode/end", body={"reward": 0.25}, cast_to=object)
  bob = client("bob")
  bob.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Hi."}])
  bob.post("/episode/end", body={}, cast_to=object)
  server_thread.join(timeout=120)
  done = dict(result["done"])
  assert sorted(done) == ["alice", "bob"]
  served = done["alice"]
  assert served.env_failure is None and served.outcome == 0.25 and served.info["turns"] == 2
  prompt = policy.chat.prompt(messages[:1])
  np.testing.assert_array_equal(served.tokens[:len(prompt)], prompt)
  returned = [entry.logprob for reply in (first, second)
              for entry in reply.choices[0].logprobs.content]
  np.testing.assert_array_equal(served.behavior_logp[served.action_mask == 1],
                                np.float32(returned))
  assert "without a reward" in done["bob"].env_failure
  assert any(line.startswith("episode alice: 2 turns, ") and line.endswith("reward 0.25")
             for line in lines), lines
  # Served episodes stop the endpoint: its port no longer answers.
  with pytest.raises(openai.APIConnectionError):
    alice.chat.completions.create(model="policy", messages=messages[:1])
