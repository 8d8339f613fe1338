"""Agent programs on the real `openai` client, through the endpoint, into trajectories.

The exactness test: a trajectory's tokens are the prompt the chat template renders,
the tokens the engine sampled, and the rendered new messages, nothing else; its
behavior_logp equals what the endpoint returned as `logprobs` and what the learner's
forward recomputes.
"""

import jax
import numpy as np
import pytest

import agent_programs
from conftest import SAMPLER
from sao_jax.config import EnvConfig
from sao_jax.envs.agent import spec as agent_spec
from sao_jax.envs.base import Task
from sao_jax.models import forward
from sao_jax.sampler.episodes import EpisodeRunner, make_engine, run_to_completion

policy_forward = jax.jit(forward.policy_forward, static_argnums=1)
PAD_TO = 1024


def run(policy, program, n, *, env=EnvConfig(), **options):
  engine = make_engine(SAMPLER, policy.model, policy.params, policy.chat)
  options = agent_spec.AgentOptions(program=f"agent_programs:{program}", **options)
  make = lambda: agent_spec.make(options, env)
  runner = EpisodeRunner(engine, policy.chat, make, max_episodes=n, env_threads=n,
                         log=lambda text: None)
  tasks = iter([Task(id=f"{program}-{i}", prompt=f"What is {i} + 2?", answer=str(i + 2))
                for i in range(n)])
  done = run_to_completion(runner, tasks, n, num_slots=1, seed=0)
  runner.close()
  return sorted(done, key=lambda t: t.info["task"]), runner


def action_runs(mask):
  edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
  return list(zip(edges[::2], edges[1::2]))


def learner_logp(policy, trajectory):
  t = len(trajectory.tokens)
  tokens, mask = np.zeros((1, PAD_TO), np.int32), np.zeros((1, PAD_TO), np.int32)
  tokens[0, :t], mask[0, :t] = trajectory.tokens, 1
  out = policy_forward(policy.params, policy.model, tokens, mask, np.float32(SAMPLER.temperature))
  return np.asarray(out.logp_BxT)[0, :t]


def test_openai_client_episodes_are_exactly_what_was_sampled_and_rendered(policy):
  chat = policy.chat
  trajectories, runner = run(policy, "two_turns", 3)
  assert not runner.failures and len(trajectories) == 3
  for trajectory in trajectories:
    calls = agent_programs.SEEN[trajectory.info["task"]]
    assert len(calls) == 2 and trajectory.env_failure is None
    assert trajectory.outcome == 0.5 and trajectory.info["turns"] == 2
    runs = action_runs(trajectory.action_mask)
    assert len(runs) == 2
    # Tokens: prompt, sampled, rendered continuation, sampled (and nothing re-tokenised).
    (first, response1), (second, response2) = calls
    prompt = chat.prompt(first)
    sampled1 = trajectory.tokens[runs[0][0]:runs[0][1]]
    closed = int(sampled1[-1]) == chat.end_token_id
    history = [*first, {"role": "assistant", "content": response1.choices[0].message.content}]
    glue = chat.continuation(history, second[len(history):], closed=closed)
    sampled2 = trajectory.tokens[runs[1][0]:runs[1][1]]
    np.testing.assert_array_equal(trajectory.tokens,
                                  np.concatenate([prompt, sampled1, glue, sampled2]))
    # The endpoint's logprobs are the recorded behavior_logp and the learner's recomputation.
    returned = np.array([entry.logprob for response in (response1, response2)
                         for entry in response.choices[0].logprobs.content], np.float32)
    on = trajectory.action_mask == 1
    np.testing.assert_array_equal(trajectory.behavior_logp[on], returned)
    np.testing.assert_allclose(learner_logp(policy, trajectory)[on], returned, atol=1e-4)
    # Each returned token is the text of the sampled id.
    tokens_text = [entry.token for response in (response1, response2)
                   for entry in response.choices[0].logprobs.content]
    assert tokens_text == [chat.tokenizer.decode([int(i)], skip_special_tokens=False)
                           for i in trajectory.tokens[on]]
    for response, run_ in zip((response1, response2), runs):
      # usage: the context the turn was sampled from, and the turn.
      usage = response.usage
      assert (usage.prompt_tokens, usage.completion_tokens) == (run_[0], run_[1] - run_[0])
      assert usage.total_tokens == run_[1]
      finish = response.choices[0].finish_reason
      ended = int(trajectory.tokens[run_[1] - 1]) == chat.end_token_id
      assert finish == ("stop" if ended else "length"), finish


def test_tools_and_tool_results_render_with_the_checkpoint_template(policy):
  trajectories, runner = run(policy, "tool_history", 1)
  trajectory, = trajectories
  (sent, response), = agent_programs.SEEN[trajectory.info["task"]]
  expected_prompt = policy.chat.prompt(
      [sent[0], {"role": "assistant", "content": "", "tool_calls": [
          {"type": "function", "id": "c1", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
       {"role": "tool", "content": "4", "tool_call_id": "c1"}],
      tools=[{"type": "function", "function": {
          "name": "add", "description": "Add two numbers.",
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                          "b": {"type": "integer"}},
                         "required": ["a", "b"]}}}])
  text = policy.chat.tokenizer.decode(expected_prompt.tolist(), skip_special_tokens=False)
  assert "<tool_call>" in text and "<tool_response>" in text and '"name": "add"' in text
  start = action_runs(trajectory.action_mask)[0][0]
  np.testing.assert_array_equal(trajectory.tokens[:start], expected_prompt)
  assert trajectory.outcome == 1.0 and trajectory.info["end"] == "agent_reward"


def test_a_client_that_edits_its_history_starts_a_new_segment(policy):
  trajectories, runner = run(policy, "edits_history", 1)
  trajectory, = trajectories
  calls = agent_programs.SEEN[trajectory.info["task"]]
  assert trajectory.info["segments"] == 2 and trajectory.info["metrics"]["new_segments"] == 1
  # The trajectory is the last segment: the edited conversation's own prompt, then a turn.
  prompt = policy.chat.prompt(calls[1][0])
  np.testing.assert_array_equal(trajectory.tokens[:len(prompt)], prompt)
  # The second call's usage counts its own conversation, not the dropped segment's.
  assert calls[1][1].usage.prompt_tokens == len(prompt)
  assert action_runs(trajectory.action_mask) == [(len(prompt), len(trajectory.tokens))]
  assert trajectory.outcome == 1.0


@pytest.mark.parametrize("program, kind", [("no_reward", "env_declared"),
                                           ("raises", "AgentProgramError")])
def test_programs_that_fail_are_counted_not_trained(policy, program, kind):
  trajectories, runner = run(policy, program, 1)
  trajectory, = trajectories
  assert trajectory.env_failure and trajectory.info["failure_kind"] == kind


def test_a_program_past_its_time_limit_is_failed_and_counted(policy):
  trajectories, runner = run(policy, "never_ends", 1, time_limit_s=1.0)
  trajectory, = trajectories
  assert trajectory.info["failure_kind"] == "AgentTimeout"
  assert runner.failures["AgentTimeout"] == 1


def conversation_length(response, task, messages):
  """A grader that pays the number of messages it was shown (and checks the last)."""
  assert messages[-1] == {"role": "assistant", "content": response}
  return float(len(messages))


def test_env_reward_fn_grades_the_whole_conversation(policy):
  from sao_jax.envs import rewards
  engine = make_engine(SAMPLER, policy.model, policy.params, policy.chat)
  options = agent_spec.AgentOptions(program="agent_programs:two_turns")
  graded = EnvConfig(reward_fn="test_agent_episodes:conversation_length")
  make = lambda: rewards.RewardFnEnv(agent_spec.make(options, graded), conversation_length,
                                     path=graded.reward_fn, timeout_s=5.0)
  runner = EpisodeRunner(engine, policy.chat, make, max_episodes=1, log=lambda text: None)
  trajectory, = run_to_completion(runner, iter([Task(id="graded", prompt="1 + 1?", answer="2")]),
                                  1, num_slots=1, seed=0)
  # system, user, assistant, user (the follow-up), assistant: the grader replaces the 0.5.
  assert trajectory.outcome == 5.0 and trajectory.info["end"] == "reward_fn"
