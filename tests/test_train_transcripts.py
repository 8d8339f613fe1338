"""Training writes the first and last batches' first episodes as text, with or without
evaluations (#49 item 9: transcripts were written only when run.eval_every > 0)."""

import json
import pathlib

import numpy as np

from sao_jax.chat import chat_format
from sao_jax.config import load_config
from sao_jax.data import pipeline
from sao_jax.jobs import train_transcripts
from sao_jax.run import bootstrap
from sao_jax.types import Trajectory

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _trajectory(chat, question: str, answer: str, reward: float) -> Trajectory:
  tokens, action = chat.encode([{"role": "user", "content": question},
                                {"role": "assistant", "content": answer}])
  rewards = np.zeros(tokens.size, np.float32)
  rewards[np.flatnonzero(action)[-1]] = reward  # the outcome on the last action token
  return Trajectory(tokens=tokens, action_mask=action.astype("int8"),
                    behavior_logp=np.zeros(tokens.size, np.float32), rewards=rewards,
                    prompt_id=0, policy_versions=(0, 0))


def test_the_first_and_last_steps_write_their_first_episodes_as_text(tmp_path):
  cfg = load_config(ROOT / "configs" / "sanity_cpu.py",
                    [f"run.run_dir={tmp_path}", "run.eval_every=0", "learner.steps=7"])
  chat = chat_format(None, bootstrap.train_run_tokenizer(cfg, transcripts=20))
  trajs = [_trajectory(chat, f"what is {i} + 1?", f"{i + 1}", float(i % 2))
           for i in range(train_transcripts.TRAIN_TRANSCRIPTS + 2)]
  batch = pipeline.pad_batch(trajs, len(trajs), 256, cfg.data.pad_id)
  assert train_transcripts.transcript_steps(cfg) == (0, 6)
  path = train_transcripts.train_transcripts_path(cfg, 6)
  assert path == tmp_path / "transcripts" / "train_step_6.jsonl"
  train_transcripts.write_batch_transcripts(path, batch, chat, 6)
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  assert len(rows) == train_transcripts.TRAIN_TRANSCRIPTS  # bounded: not the whole batch
  for row, traj in zip(rows, trajs):
    assert row == {"step": 6, "reward": traj.outcome,
                   "action_tokens": int(traj.action_mask.sum()),
                   "text": chat.tokenizer.decode(traj.tokens.tolist(),
                                                 skip_special_tokens=False)}
  assert [row["reward"] for row in rows] == [0.0, 1.0, 0.0, 1.0]
  assert "what is 2 + 1?" in rows[2]["text"]
