"""An agent framework from the registries, the OpenAI Agents SDK, drives the endpoint
unmodified (issue #51 item 5): its requests (instructions, function tools as JSON
schemas with `strict`, an earlier tool call and its output) render with the
checkpoint's template as the trajectory's prompt, and the log-probs it reads back are
the trajectory's behavior_logp, token for token."""

import numpy as np
import pytest

pytest.importorskip("agents")  # the dev extra's openai-agents

import sdk_programs  # noqa: E402
from conftest import SAMPLER  # noqa: E402
from sao_jax.config import EnvConfig  # noqa: E402
from sao_jax.envs.agent import protocol, spec as agent_spec  # noqa: E402
from sao_jax.envs.base import Task  # noqa: E402
from sao_jax.sampler.episodes import EpisodeRunner, make_engine, run_to_completion  # noqa: E402


@pytest.mark.slow  # imports the SDK and compiles an engine (~40 s on 2 shared cores)
def test_an_agents_sdk_program_yields_exactly_what_it_was_served(policy):
  engine = make_engine(SAMPLER, policy.model, policy.params, policy.chat)
  options = agent_spec.AgentOptions(program="sdk_programs:tool_agent")
  runner = EpisodeRunner(engine, policy.chat, lambda: agent_spec.make(options, EnvConfig()),
                         max_episodes=2, env_threads=2, log=lambda text: None)
  tasks = [Task(id=f"sdk-{i}", prompt=f"What is {i} + 2?", answer=str(i + 2)) for i in range(2)]
  done = run_to_completion(runner, iter(tasks), len(tasks), num_slots=1, seed=0)
  runner.close()
  assert not runner.failures and len(done) == 2
  exact = 0
  for trajectory in done:
    task = trajectory.info["task"]
    sent, result = sdk_programs.SENT[task], sdk_programs.RESULTS[task]
    assert trajectory.env_failure is None and trajectory.outcome == 1.0
    assert len(sent) == trajectory.info["turns"] >= 1
    # The first request, as the template renders it, is the trajectory's prompt.
    assert sent[0]["logprobs"] is True and sent[0]["top_logprobs"] == 0
    first = protocol.parse_request(sent[0], max_messages=64)
    assert [m["role"] for m in first.messages] == ["system", "user", "assistant", "tool"]
    assert first.messages[2]["tool_calls"][0]["function"] == {"name": "add",
                                                              "arguments": {"a": 2, "b": 2}}
    prompt = policy.chat.prompt(list(first.messages), tools=list(first.tools))
    np.testing.assert_array_equal(trajectory.tokens[:len(prompt)], prompt)
    text = policy.chat.tokenizer.decode(prompt.tolist(), skip_special_tokens=False)
    assert '"name": "add"' in text and "<tool_response>\n4\n</tool_response>" in text
    if result is None:  # the policy called tools to the SDK's last turn
      continue
    # What the SDK read back: each sampled token's log-prob, the recorded behavior_logp.
    logprobs = [entry.logprob for response in result.raw_responses for item in response.output
                if item.type == "message" for part in item.content
                for entry in (part.logprobs or [])]
    on = trajectory.action_mask == 1
    if len(sent) == 1:  # one turn, answered in text: every sampled token came back
      np.testing.assert_array_equal(np.float32(logprobs), trajectory.behavior_logp[on])
      answer = policy.chat.tokenizer.decode(trajectory.tokens[on].tolist(),
                                            skip_special_tokens=True)
      assert result.final_output == answer
      exact += 1
  assert exact >= 1  # the random policy answers in text at once, at least once
