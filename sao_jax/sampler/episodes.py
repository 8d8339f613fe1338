"""Multi-turn episodes: the engine generates actions, environments answer them.

`EpisodeRunner` keeps up to `max_episodes` episodes in flight on one `Engine`:
it renders an environment's messages with the chat template, submits the
prompt, and for every turn the engine returns it decodes the action text, calls
`env.step`, and either appends the observation (chat glue + tool/user message +
generation prompt, all action_mask 0) or finishes the episode into a
`records.Trajectory` with the reward on the last action token.

Chat glue after a turn: a turn that ended on `<|im_end|>` already closed its
message, so the observation starts with the newline the template puts after
it; a turn cut by a stop pattern (a complete python tool call) or a length
limit gets `<|im_end|>\\n` first. Both are observation tokens: the policy is
credited only for tokens it sampled.

An environment failure ends the episode with `env_failure` set, so the learner
counts and drops it instead of training on reward 0. An episode that runs out of
context is finished with reward 0 and `info["truncated"] = True`. `info["end"]`
is why the episode ended (the environment's reason, e.g. "answer" or
"max_turns", or "truncated") and `info["last_turn_end"]` why its last turn did
(the engine's finish_reason: "max_new_tokens" / "max_seq_len" = cut by length).
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Callable, Iterator

import jax
import numpy as np

from sao_jax.data.records import Trajectory
from sao_jax.envs.base import Environment, Task
from sao_jax.models.tokenizer import IM_END, encode_chat
from sao_jax.config import ModelConfig, SamplerConfig
from sao_jax.models.transformer import Params
from sao_jax.sampler.engine import Engine, Turn, stop_token_ids


def make_engine(cfg: SamplerConfig, model_cfg: ModelConfig, params: Params, tokenizer, *,
                version: int = 0, mesh: jax.sharding.Mesh | None = None) -> Engine:
  """An `Engine` whose stop tokens and stop-pattern text come from `tokenizer`."""
  return Engine(cfg, model_cfg, params, version=version, mesh=mesh,
                stop_token_ids=stop_token_ids(tokenizer, cfg.stop_tokens),
                detokenize=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False))


def prompt_slot(task: Task, num_slots: int) -> int:
  """A task's running-mean / group id in [0, num_slots): a stable hash of its id."""
  return zlib.crc32(task.id.encode()) % num_slots


@dataclasses.dataclass
class _Live:
  env: Environment
  task: Task
  prompt_id: int
  turns: int = 0
  last_turn_end: str = ""  # the engine's finish_reason of the latest turn


class EpisodeRunner:
  """Drives episodes of `make_env()` environments through `engine`."""

  def __init__(self, engine: Engine, tokenizer, make_env: Callable[[], Environment], *,
               max_episodes: int):
    self.engine, self._tokenizer, self._make_env = engine, tokenizer, make_env
    self.max_episodes = max_episodes
    self._live: dict[int, _Live] = {}
    self._next_id = 0
    self._im_end = tokenizer.token_to_id(IM_END)
    self._newline = tokenizer.encode("\n", add_special_tokens=False).ids

  @property
  def in_flight(self) -> int:
    return len(self._live)

  def start(self, task: Task, *, prompt_id: int, seed: int) -> None:
    env = self._make_env()
    # Environments that change during training (the style schedule) see the policy
    # version the episode starts with.
    env.set_step(self.engine.version)
    prompt, _ = encode_chat(self._tokenizer, env.reset(task), add_generation_prompt=True)
    episode_id = self._next_id
    self._next_id += 1
    self.engine.submit(episode_id, prompt, seed=seed % 2**32)
    self._live[episode_id] = _Live(env, task, prompt_id)

  def step(self) -> list[Trajectory]:
    """One engine step; returns the episodes that finished."""
    finished = []
    for turn in self.engine.step():
      done = self._advance(turn)
      if done is not None:
        finished.append(done)
    return finished

  def _advance(self, turn: Turn) -> Trajectory | None:
    live = self._live[turn.episode_id]
    live.turns += 1
    action = self._tokenizer.decode(turn.tokens.tolist(), skip_special_tokens=True)
    result = live.env.step(action)
    live.last_turn_end = turn.finish_reason
    if result.done:
      return self._finish(turn.episode_id, reward=result.reward or 0.0,
                          failure=result.failure, reason=result.reason)
    glue = [] if turn.tokens.size and turn.tokens[-1] == self._im_end else [self._im_end]
    message = {"role": live.env.observation_role, "content": result.observation}
    observation, _ = encode_chat(self._tokenizer, [message], add_generation_prompt=True)
    tokens = np.concatenate([np.asarray(glue + self._newline, np.int32), observation])
    if tokens.size >= self.engine.room(turn.episode_id):
      return self._finish(turn.episode_id, reward=0.0, failure=None, reason="truncated")
    self.engine.submit(turn.episode_id, tokens)
    return None

  def _finish(self, episode_id: int, *, reward: float, failure: str | None,
              reason: str | None) -> Trajectory:
    live = self._live.pop(episode_id)
    out = self.engine.finish(episode_id)
    rewards = np.zeros(out.tokens.shape, np.float32)
    action_positions = np.flatnonzero(out.action_mask)
    if action_positions.size:
      rewards[action_positions[-1]] = reward
    versions = out.policy_versions or (self.engine.version, self.engine.version)
    return Trajectory(tokens=out.tokens.astype(np.int32), action_mask=out.action_mask.astype(np.int8),
                      behavior_logp=out.behavior_logp.astype(np.float32), rewards=rewards,
                      prompt_id=live.prompt_id, policy_versions=tuple(versions),
                      env_failure=failure,
                      info={"task": live.task.id, "turns": live.turns, "end": reason or "",
                            "truncated": reason == "truncated",
                            "last_turn_end": live.last_turn_end})


def run_to_completion(runner: EpisodeRunner, tasks: Iterator[Task], count: int, *,
                      num_slots: int, seed: int) -> list[Trajectory]:
  """Runs `count` episodes (e.g. an evaluation), keeping the runner saturated."""
  done: list[Trajectory] = []
  started = 0
  while len(done) < count:
    while started < count and runner.in_flight < runner.max_episodes:
      task = next(tasks)
      runner.start(task, prompt_id=prompt_slot(task, num_slots), seed=seed + started)
      started += 1
    done.extend(runner.step())
  return done
