"""`Trajectory`: one finished rollout on the host, its validation and its bytes.

A trajectory is one token sequence `x[0..T)` with per-token arrays aligned to
it (index t belongs to token t, SAO.md §1) and per-trajectory metadata. It is
what the sampler hands to the transport and what the learner's pipeline pads
into a `Batch`.

`problems(traj, vocab_size)` names everything that would make a trajectory
unsafe to train on (wrong shapes, non-finite values, no action token, rewards or
log-probs off the action mask, token ids out of range); the pipeline rejects such
trajectories with the reason counted, so they never reach the loss.

`to_bytes` / `from_bytes` give a compact, pickle-free encoding (an `.npz`
archive) for record files that cross hosts.
"""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np

ARRAYS = ("tokens", "action_mask", "behavior_logp", "rewards")


@dataclasses.dataclass
class Trajectory:
  tokens: np.ndarray  # [T] int32
  action_mask: np.ndarray  # [T] int8, 1 on sampled tokens
  behavior_logp: np.ndarray  # [T] float32, 0 off the action mask
  rewards: np.ndarray  # [T] float32, the outcome on the last action token
  prompt_id: int  # GRPO group / running-mean slot
  policy_versions: tuple[int, int]  # first and last learner version that sampled it
  env_failure: str | None = None  # the environment failed: train on none of it
  info: dict = dataclasses.field(default_factory=dict)  # JSON-able extras (task id, turns)

  @property
  def length(self) -> int:
    return int(self.tokens.shape[0])

  @property
  def outcome(self) -> float:
    return float(np.sum(self.rewards[self.action_mask.astype(bool)]))


def problems(traj: Trajectory, vocab_size: int | None = None) -> list[str]:
  """Reasons `traj` must not be trained on (empty if it is fine). Reason strings
  are short stable keys used as drop counters, e.g. 'nan_logp'."""
  arrays = [np.asarray(getattr(traj, name)) for name in ARRAYS]
  if any(a.ndim != 1 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
    return ["bad_shape"]
  if traj.length == 0:
    return ["empty"]
  found = []
  action = traj.action_mask.astype(bool)
  if not action.any():
    found.append("no_action_tokens")
  if not np.all(np.isin(traj.action_mask, (0, 1))):
    found.append("bad_action_mask")
  if not np.all(np.isfinite(traj.behavior_logp)):
    found.append("nan_logp")
  elif np.any(traj.behavior_logp[action] > 1e-6) or np.any(traj.behavior_logp[~action] != 0):
    found.append("bad_logp")
  if not np.all(np.isfinite(traj.rewards)):
    found.append("nan_reward")
  elif np.any(traj.rewards[~action] != 0):
    found.append("reward_off_action")
  if vocab_size is not None and (traj.tokens.min() < 0 or traj.tokens.max() >= vocab_size):
    found.append("token_out_of_range")
  if traj.policy_versions[0] > traj.policy_versions[1]:
    found.append("bad_versions")
  return found


def to_bytes(traj: Trajectory) -> bytes:
  meta = {"prompt_id": int(traj.prompt_id), "policy_versions": list(traj.policy_versions),
          "env_failure": traj.env_failure, "info": traj.info}
  buffer = io.BytesIO()
  np.savez(buffer, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
           **{name: np.asarray(getattr(traj, name)) for name in ARRAYS})
  return buffer.getvalue()


def from_bytes(data: bytes) -> Trajectory:
  with np.load(io.BytesIO(data), allow_pickle=False) as archive:
    meta = json.loads(archive["meta"].tobytes().decode())
    arrays = {name: archive[name] for name in ARRAYS}
  return Trajectory(**arrays, prompt_id=meta["prompt_id"],
                    policy_versions=tuple(meta["policy_versions"]),
                    env_failure=meta["env_failure"], info=meta["info"])
