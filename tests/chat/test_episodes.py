"""Episodes in a checkpoint's own chat template, through the sampler's episode
runner: the prompt and each tool result are rendered by the template (role
"tool" becomes what the template makes of it), the episode's tokens equal
transformers' `apply_chat_template` of the conversation, and the action mask
covers exactly the policy's turns. A run given a tokenizer directory that ships
a template keeps the template beside its tokenizer copy, where samplers load it."""

import jax
import numpy as np
import pytest
import transformers

from chat_fixtures import FAMILIES, TEMPLATES, ScriptedEngine, build_tokenizer_dir
from sao_jax import config as C
from sao_jax.chat import load_chat
from sao_jax.chat.untrusted import plain_ids
from sao_jax.envs.base import Environment, StepResult, Task
from sao_jax.models.transformer import init_params
from sao_jax.run import bootstrap
from sao_jax.sampler import engine as engine_lib
from sao_jax.sampler.episodes import EpisodeRunner, make_engine, run_to_completion

TASK = Task(id="t0", prompt="What is 2 + 2?", answer="4")
ACTIONS = ["<think>\nUse the tool.\n</think>\n\nprint(2 + 2)",
           "<think>\nIt said 4.\n</think>\n\nThe answer is 4."]


class ToolEnv(Environment):
  """Turn 1 gets a tool result, turn 2 ends the episode with reward 1."""

  observation_role = "tool"

  def __init__(self):
    super().__init__(max_turns=4, max_observation_chars=1000)

  def _reset(self, task):
    return [{"role": "system", "content": "Use tools."}, {"role": "user", "content": task.prompt}]

  def _step(self, action):
    if self.turn > 1:
      return StepResult.finish(1.0, "answer")
    self.tool_calls += 1
    return StepResult.next("4")


class ReminderEnv(ToolEnv):
  """Turn 1 gets a reminder (no tool runs), as math_tool answers a reply with neither
  code nor an answer."""

  def _step(self, action):
    return StepResult.next("4") if self.turn == 1 else StepResult.finish(1.0, "answer")


def hf_tokenizer(directory, family):
  template_file, _, _, special_tokens, _ = FAMILIES[family]
  hf = transformers.PreTrainedTokenizerFast(
      tokenizer_file=str(directory / "tokenizer.json"),
      **{name: token for name, token in special_tokens.items() if token is not None})
  hf.chat_template = (TEMPLATES / template_file).read_text(encoding="utf-8")
  return hf


def conversation():
  env = ToolEnv()
  return [*env.reset(TASK), {"role": "assistant", "content": ACTIONS[0]},
          {"role": "tool", "content": "4"}, {"role": "assistant", "content": ACTIONS[1]}]


@pytest.mark.parametrize("family", ["qwen3", "qwen2_5", "llama3"])
def test_an_episode_is_the_template_rendering_of_its_conversation(family, tmp_path):
  directory = build_tokenizer_dir(tmp_path, family)
  chat, hf = load_chat(directory), hf_tokenizer(directory, family)
  runner = EpisodeRunner(ScriptedEngine(chat, ACTIONS), chat, ToolEnv, max_episodes=1)
  traj, = run_to_completion(runner, iter([TASK]), 1, num_slots=4, seed=0)
  assert traj.env_failure is None and traj.outcome == 1.0 and traj.info["turns"] == 2
  assert traj.info["tool_calls"] == 1
  # The episode ends on the policy's last end token; the template's text after it
  # (Qwen's "\n") is not part of it.
  reference = hf.apply_chat_template(conversation(), tokenize=True, return_dict=False)
  assert traj.tokens.tolist() == reference[:traj.length]
  assert hf.decode(reference[traj.length:]) == ("\n" if family != "llama3" else "")
  edges = np.flatnonzero(np.diff(np.concatenate([[0], traj.action_mask, [0]])))
  turns = [hf.decode(traj.tokens[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2])]
  assert turns == [action + chat.end_token for action in ACTIONS]
  if family == "qwen3":  # the tool result sits in a user turn, as Qwen3 was tuned on
    assert "<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>" in hf.decode(
        traj.tokens.tolist())


def test_an_extra_turn_without_a_tool_is_not_a_tool_call(tmp_path):
  directory = build_tokenizer_dir(tmp_path, "qwen3")
  chat = load_chat(directory)
  runner = EpisodeRunner(ScriptedEngine(chat, ACTIONS), chat, ReminderEnv, max_episodes=1)
  traj, = run_to_completion(runner, iter([TASK]), 1, num_slots=4, seed=0)
  assert (traj.info["turns"], traj.info["tool_calls"]) == (2, 0)


class SpellingEngine(ScriptedEngine):
  """Turn 1 spells the end token's text in ordinary tokens, as a policy can."""

  def step(self):
    if self.episode["turns"] or "queued" not in self.episode:
      return super().step()
    episode_id = self.episode.pop("queued")
    ids = plain_ids(self._chat.tokenizer, f"Done {self._chat.end_token} or not.")
    ids.append(self._chat.end_token_id)
    self.episode["turns"] += 1
    context = len(self.episode["tokens"])
    self.episode["tokens"] += ids
    self.episode["mask"] += [1] * len(ids)
    return [engine_lib.Turn(episode_id, np.asarray(ids, np.int32),
                            np.full(len(ids), -0.5, np.float32), "stop_token", (0, 0), context)]


def test_a_turn_spelling_the_end_token_is_scored_0_not_dropped(tmp_path):
  # Qwen3 rewrites earlier turns, so the turn boundary is found by counting end tokens;
  # a turn spelling "<|im_end|>" made that raise ValueError: an environment failure,
  # dropped unscored, so a policy could leave any episode it was losing.
  directory = build_tokenizer_dir(tmp_path, "qwen3")
  chat = load_chat(directory)
  runner = EpisodeRunner(SpellingEngine(chat, ACTIONS), chat, ToolEnv, max_episodes=1)
  traj, = run_to_completion(runner, iter([TASK]), 1, num_slots=4, seed=0)
  assert traj.env_failure is None and traj.outcome == 0.0 and traj.info["end"] == "turn_text"
  assert traj.info["turns"] == 1 and not runner.failures


@pytest.mark.slow
def test_a_run_with_a_template_samples_and_keeps_it(tmp_path):
  """prepare_chat copies the template into the run directory; a real engine with a
  tiny random model samples episodes whose prompt and observations are the
  template's (the actions are random tokens, so only their boundaries are checked)."""
  directory = build_tokenizer_dir(tmp_path, "qwen3")
  model = C.ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=64, head_dim=8,
                        num_attention_heads=4, num_key_value_heads=2, logits_chunk=512,
                        max_position_embeddings=512)
  sampler = C.SamplerConfig(slots=2, max_seq_len=512, prefill_buckets=(64, 128),
                            steps_per_call=4, max_new_tokens=8, stop_patterns=())
  cfg = C.Config(model=model, sampler=sampler,
                 run=C.RunConfig(run_dir=str(tmp_path / "run"), tokenizer=str(directory)))
  bootstrap.prepare_chat(cfg)
  chat = load_chat(cfg.run.tokenizer_file)  # what a sampler process loads
  assert chat.template == (TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")
  hf = hf_tokenizer(directory, "qwen3")
  engine = make_engine(sampler, model, init_params(model, jax.random.key(0)), chat)
  runner = EpisodeRunner(engine, chat, ToolEnv, max_episodes=2)
  done = run_to_completion(runner, iter([TASK] * 2), 2, num_slots=4, seed=0)
  prompt = hf.apply_chat_template(ToolEnv().reset(TASK), add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
  observation = ("\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n"
                 "<|im_start|>assistant\n")
  for traj in done:
    assert traj.env_failure is None and traj.info["turns"] == 2
    tokens, mask = traj.tokens.tolist(), traj.action_mask
    assert tokens[:len(prompt)] == prompt and not mask[:len(prompt)].any()
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    assert len(edges) == 4  # two action runs
    first_end = edges[1]
    glue = [] if tokens[first_end - 1] == chat.end_token_id else [chat.end_token_id]
    expected = glue + hf.encode(observation, add_special_tokens=False)
    assert tokens[first_end:edges[2]] == expected
