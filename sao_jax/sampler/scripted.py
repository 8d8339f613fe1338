"""A stand-in for `Engine` that plays scripted turns, for the environment side.

  engine = ScriptedEngine(chat, lambda episode_id, turn: f"turn {turn} of {episode_id}")
  runner = EpisodeRunner(engine, chat, make_env, max_episodes=4)

It implements what `sao_jax.sampler.episodes.EpisodeRunner` calls (`version`, `submit`,
`step`, `dispatch`, `ready`, `complete`, `busy`, `room`, `finish`) without a
model: turn k of episode e
"samples" the tokens of `script(e, k)` followed by the chat format's end token,
with behavior_logp `LOGP` on every sampled token. Every queued episode's turn
ends in the same `step`, as when a decode call finishes many tool calls at
once, so tests and benchmarks (`benchmarks/coding_env.py`) drive environments
through the real runner at their own speed.
"""

from __future__ import annotations

from typing import Callable, Hashable

import numpy as np

from sao_jax.chat import ChatFormat
from sao_jax.sampler.engine import Generation, Turn

LOGP = -0.5  # the behavior_logp of every scripted token


class StepAtOnce:
  """`Engine.dispatch` / `ready` / `complete` for a stand-in whose `step` has no
  device call to wait for: `dispatch` plays the step, `complete` returns its turns."""

  overlaps_host = True  # as on an accelerator: the runner's overlap path runs

  def dispatch(self) -> list[Turn]:
    return self.step()

  @staticmethod
  def ready(step: list[Turn]) -> bool:
    return True

  @staticmethod
  def complete(step: list[Turn]) -> list[Turn]:
    return step


class ScriptedEngine(StepAtOnce):
  """`Engine`'s runner-facing part, playing `script(episode_id, turn) -> text`."""

  def __init__(self, chat: ChatFormat, script: Callable[[Hashable, int], str]):
    self.version, self._chat, self._script = 0, chat, script
    self.episodes: dict[Hashable, dict] = {}  # tokens, mask, turns (and "queued") per episode

  def submit(self, episode_id: Hashable, tokens, *, seed: int | None = None) -> None:
    episode = self.episodes.setdefault(episode_id, {"tokens": [], "mask": [], "turns": 0})
    episode["tokens"] += list(tokens)
    episode["mask"] += [0] * len(tokens)
    episode["queued"] = True

  def step(self) -> list[Turn]:
    turns = []
    for episode_id, episode in self.episodes.items():
      if episode.pop("queued", False):
        ids = self._chat.tokenizer.encode(self._script(episode_id, episode["turns"]),
                                          add_special_tokens=False).ids
        ids.append(self._chat.end_token_id)
        episode["turns"] += 1
        context = len(episode["tokens"])
        episode["tokens"] += ids
        episode["mask"] += [1] * len(ids)
        turns.append(Turn(episode_id, np.asarray(ids, np.int32),
                          np.full(len(ids), LOGP, np.float32), "stop_token", (0, 0), context))
    return turns

  @property
  def busy(self) -> bool:
    """Whether `step` has a turn to play."""
    return any(episode.get("queued", False) for episode in self.episodes.values())

  def room(self, episode_id: Hashable) -> int:
    return 1 << 30

  def finish(self, episode_id: Hashable) -> Generation:
    episode = self.episodes.pop(episode_id)
    mask = np.asarray(episode["mask"], np.int32)
    return Generation(episode_id, np.asarray(episode["tokens"], np.int32), mask,
                      LOGP * mask.astype(np.float32), (0, 0), episode["turns"])
