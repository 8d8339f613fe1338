"""Orbax checkpoints of the learner: train state, data-pipeline state, metadata.

One checkpoint per saved step, three items:
  state  the `TrainState` (params, optimizer states, step, policy version,
         baseline windows, skip counter), saved sharded, restored against an
         abstract state whose shardings may describe a different mesh;
  data   the data pipeline's JSON state (iterator position, RNG, counters), so a
         resumed run consumes exactly the batches an uninterrupted one would;
  meta   the run's config, step and policy version, checked on restore.

Atomicity: orbax writes a step into a temporary directory and renames it only
after every item is finalised, so `latest_step()` never sees a half-written
checkpoint (a crash mid-save leaves only a `*.orbax-checkpoint-tmp*` directory,
which is ignored). Saves are asynchronous when `async_save` is on: the step
returns once device buffers are copied and the write proceeds in background.

Preemption: `PreemptionWatcher` turns SIGTERM (what a TPU VM receives before it
is reclaimed) into a flag the training loop polls between steps; the loop then
saves and exits cleanly.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

import jax
import orbax.checkpoint as ocp

from sao_jax.config import CheckpointConfig, Config
from sao_jax.storage import storage_path

FORMAT_VERSION = 1


class CheckpointError(ValueError):
  """A checkpoint that cannot be used: corrupt, or from a different run shape."""


def _describe_difference(saved: dict, current: dict, prefix: str = "") -> list[str]:
  diffs = []
  for key in sorted(set(saved) | set(current)):
    a, b = saved.get(key, "<missing>"), current.get(key, "<missing>")
    if isinstance(a, dict) and isinstance(b, dict):
      diffs += _describe_difference(a, b, f"{prefix}{key}.")
    elif a != b and not (isinstance(a, list) and isinstance(b, tuple) and a == list(b)):
      diffs.append(f"{prefix}{key}: checkpoint {a!r} vs config {b!r}")
  return diffs


class Checkpointer:
  """Saves and restores learner checkpoints under `cfg.checkpoint.directory`."""

  def __init__(self, cfg: Config):
    ckpt: CheckpointConfig = cfg.checkpoint
    if ckpt.directory is None:
      raise ValueError("checkpoint.directory is None; set --set checkpoint.directory=PATH "
                       "to enable checkpoints")
    self._config = cfg
    self.directory = storage_path(ckpt.directory)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=ckpt.keep, save_interval_steps=ckpt.save_every_steps,
            enable_async_checkpointing=ckpt.async_save, create=True,
            cleanup_tmp_directories=True),
        item_names=("state", "data", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, data_state: dict, *, force: bool = False) -> bool:
    """Saves if `step` is on the schedule (or `force`) and not saved yet; returns
    whether it saved."""
    if step in self._manager.all_steps():
      return False
    meta = {"format": FORMAT_VERSION, "step": step,
            "policy_version": int(jax.device_get(state.policy_version)),
            "config": dataclasses.asdict(self._config)}
    return self._manager.save(
        step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                      data=ocp.args.JsonSave(data_state),
                                      meta=ocp.args.JsonSave(meta)),
        force=force)

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict, dict]:
    """(state, data_state, meta) of `step` (default: latest), laid out as `abstract_state`.

    `abstract_state` is a pytree of `jax.ShapeDtypeStruct`s carrying the target
    shardings, so a checkpoint written on one mesh restores onto another.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no finished checkpoint in {self.directory}")
    path = self.directory / str(step)
    try:
      meta = self._manager.restore(step, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore()))["meta"]
    except Exception as error:  # orbax raises many types for unreadable files
      raise CheckpointError(f"checkpoint {path} is unreadable (metadata): {error}") from error
    saved_model = meta.get("config", {}).get("model", {})
    diffs = _describe_difference(saved_model, dataclasses.asdict(self._config.model), "model.")
    if meta.get("format") != FORMAT_VERSION or diffs:
      raise CheckpointError(
          f"checkpoint {path} does not match this run: "
          + ("; ".join(diffs) or f"format {meta.get('format')} != {FORMAT_VERSION}")
          + ". Point checkpoint.directory elsewhere or restore with the original model config.")
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    except Exception as error:
      raise CheckpointError(f"checkpoint {path} cannot be restored into this train state: "
                            f"{error}") from error
    return restored["state"], restored["data"], meta

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


class PreemptionWatcher:
  """Sets `.requested` on SIGTERM instead of dying; restores the old handler on `close()`."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def close(self) -> None:
    signal.signal(signal.SIGTERM, self._previous)
