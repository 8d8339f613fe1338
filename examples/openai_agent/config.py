"""Train the agent you already have: agent.py, an openai-client program, as the environment.

    .venv/bin/pip install 'sao-jax[agent]' openai
    .venv/bin/python examples/native_tools/make_tokenizer.py runs/openai_agent/tokenizer
    PYTHONPATH=examples/openai_agent .venv/bin/sao-train --config examples/openai_agent/config.py

Each task (tasks.jsonl) runs `python agent.py` with OPENAI_BASE_URL and
OPENAI_API_KEY pointing at the sampler's endpoint (env.name="agent",
docs/tutorials/train-your-agent.md); the policy's turns are what its
`chat.completions.create` calls return, its tool calls parsed from the Qwen3
template's `<tool_call>` blocks, and the episode is graded by reward.py
(env.reward_fn). Everything else is examples/native_tools' (the tiny model,
no warm-start): on the random tiny policy the reward stays near 0; the example
shows the wiring, not learning. For a real run set run.tokenizer and run.init to
a Qwen3 / Qwen2.5 / Llama 3.1 checkpoint and `model` to its config.
`--set env.options.program=agents_sdk:run` runs the same agent written with the
OpenAI Agents SDK (agents_sdk.py, a function program) instead.
"""

import dataclasses
import pathlib
import sys

from sao_jax.config import EnvConfig, load_config

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def get_config():
  base = load_config(ROOT / "examples" / "native_tools" / "config.py")
  return dataclasses.replace(
      base, name="openai_agent",
      env=EnvConfig(name="agent", task_source="jsonl", jsonl_path=str(HERE / "tasks.jsonl"),
                    max_turns=4, step_timeout_s=120.0, reward_fn="reward:score",
                    options={"program": f"{sys.executable} {HERE / 'agent.py'}",
                             "time_limit_s": 60.0}),
      run=dataclasses.replace(base.run, run_dir="runs/openai_agent"))
