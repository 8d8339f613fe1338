"""What the policy wrote in training, as text: the first `TRAIN_TRANSCRIPTS` episodes of
the learner's first batch (step 0) and of its last (step `learner.steps - 1`), written
to RUN_DIR/transcripts/train_step_<step>.jsonl whatever `run.eval_every` is (the
held-out evaluation's transcripts, `evaluate.transcripts_path`, need evaluations).

    write_batch_transcripts(train_transcripts_path(cfg, step), batch, chat, step)
"""

from __future__ import annotations

import numpy as np

from sao_jax import storage
from sao_jax.chat import ChatFormat
from sao_jax.config import Config
from sao_jax.run import metrics
from sao_jax.types import Batch

TRAIN_TRANSCRIPTS = 4  # episodes written of the first and of the last training batch


def train_transcripts_path(cfg: Config, step: int):
  """Where training writes the episodes of the batch of learner step `step` (a path, or
  an epath.Path in a bucket run directory, `sao_jax.storage`)."""
  return storage.as_path(cfg.run.run_dir) / "transcripts" / f"train_step_{step}.jsonl"


def transcript_steps(cfg: Config) -> tuple[int, ...]:
  """The learner steps whose batch is written: the first and the last."""
  return (0, cfg.learner.steps - 1)


def write_batch_transcripts(path, batch: Batch, chat: ChatFormat, step: int,
                            count: int = TRAIN_TRANSCRIPTS) -> None:
  """The first `count` trajectories of a host `batch` (packed rows: each segment its
  own), one JSON line each: {"step", "reward" (the trajectory's summed reward),
  "action_tokens", "text"} with the text the whole token sequence decoded (prompt,
  actions, observations, special tokens kept), written atomically."""
  rows = []
  tokens, segment_ids = np.asarray(batch.tokens), np.asarray(batch.segment_ids)
  action, rewards = np.asarray(batch.action_mask) > 0, np.asarray(batch.rewards)
  for row in range(tokens.shape[0]):
    for segment in np.unique(segment_ids[row][segment_ids[row] > 0]):
      if len(rows) == count:
        break
      inside = segment_ids[row] == segment
      acted = inside & action[row]
      rows.append({"step": step, "reward": float(np.sum(rewards[row][acted])),
                   "action_tokens": int(np.sum(acted)),
                   "text": chat.tokenizer.decode(tokens[row][inside].tolist(),
                                                 skip_special_tokens=False)})
  metrics.write_jsonl(path, rows)
