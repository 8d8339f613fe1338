"""Orbax checkpoints of the learner: train state, data-pipeline state, metadata.

One checkpoint per saved step, three items:
  state  the `TrainState` (params, optimizer states, step, policy version,
         baseline windows, skip counter; with LoRA without the frozen base,
         `learner.state.checkpointed`), saved sharded, restored against an
         abstract state whose shardings may describe a different mesh;
  data   the data pipeline's JSON state (iterator position, RNG, counters), so a
         resumed run consumes exactly the batches an uninterrupted one would;
  meta   the run's config, step and policy version, checked on restore.
`restore_items` reads chosen fields of the state only (orbax's partial restore):
`sao-eval` reads the policy and never the critic or optimizer states.

Atomicity: orbax writes a step into a temporary directory and renames it only
after every item is finalised, so `latest_step()` never sees a half-written
checkpoint (a crash mid-save leaves only a `*.orbax-checkpoint-tmp*` directory,
which is ignored). Saves are asynchronous when `async_save` is on: the step
returns once device buffers are copied and the write proceeds in background.

Damage: a finished checkpoint can still be unreadable later (a disk filled up,
a file truncated or overwritten). Resuming (`restore` without a step) takes the
newest checkpoint that restores: each newer one that does not is reported in
plain words (its path and what is wrong, without TensorStore's spec dump) and
moved aside to `<directory>/corrupt-<step>-<UTC time>/`, never deleted, so its
steps are trained again. When none restores, nothing is moved and the error
lists every checkpoint's problem. A checkpoint of another model shape is not
damage: it fails at once, naming the differing fields.

Preemption: `PreemptionWatcher` turns SIGTERM (what a TPU VM receives before it
is reclaimed) into a flag the training loop polls between steps; the loop then
saves and exits cleanly.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import time
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from sao_jax.config import CheckpointConfig, Config, LoraConfig
from sao_jax.config.versions import as_this_version
from sao_jax.storage import storage_path

FORMAT_VERSION = 1


class CheckpointError(ValueError):
  """A checkpoint that cannot be used: corrupt, or from a different run shape."""


class _Damaged(CheckpointError):
  """A checkpoint whose files do not restore (an older one may)."""


# TensorStore appends `[tensorstore_spec='{...}']` and `[source locations='...']` dumps
# (kilobytes of JSON) and nests its message in "Error opening "zarr" driver: " layers.
_SPEC_TAIL = re.compile(r"\s*\[[a-z_ ]+(\[\d+\])?='.*$", re.DOTALL)
_DRIVER_LAYER = re.compile(r'Error opening "\w+" driver: ')


def plain_error(error: BaseException, limit: int = 500) -> str:
  """`error`'s message without TensorStore's spec dumps and driver layers, at most `limit`
  characters: what is wrong and with which file."""
  text = _DRIVER_LAYER.sub("", _SPEC_TAIL.sub("", str(error).strip()))
  text = text.splitlines()[0] if text else type(error).__name__
  return text if len(text) <= limit else text[:limit] + "..."


def _describe_difference(saved: dict, current: dict, prefix: str = "") -> list[str]:
  diffs = []
  for key in sorted(set(saved) | set(current)):
    a, b = saved.get(key, "<missing>"), current.get(key, "<missing>")
    if isinstance(a, dict) and isinstance(b, dict):
      diffs += _describe_difference(a, b, f"{prefix}{key}.")
    elif a != b and not (isinstance(a, list) and isinstance(b, tuple) and a == list(b)):
      diffs.append(f"{prefix}{key}: checkpoint {a!r} vs config {b!r}")
  return diffs


def _lora_difference(saved: dict | None, current: LoraConfig) -> list[str]:
  """What makes the saved state's tree differ: LoRA on/off, rank, targets (a
  checkpoint from before the lora section had it off)."""
  saved = saved or {"enabled": False}
  keys = ("enabled", "rank", "targets") if saved.get("enabled") and current.enabled else ("enabled",)
  return _describe_difference({k: saved.get(k) for k in keys},
                              {k: getattr(current, k) for k in keys}, "lora.")


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

  def saved_config(self) -> dict | None:
    """The config (a JSON dict) saved with the newest checkpoint whose metadata
    reads, or None when there is none."""
    for step in sorted(self.all_steps(), reverse=True):
      try:
        meta = self._manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"]
      except Exception:  # pylint: disable=broad-except  # damaged: `restore` reports it
        continue
      return meta.get("config")
    return None

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

  def restore(self, abstract_state: Any, step: int | None = None, *,
              log: Callable[[str], None] = print) -> tuple[Any, dict, dict]:
    """(state, data_state, meta) of `step`, laid out as `abstract_state`; without a
    step, of the newest checkpoint that restores (damaged newer ones are moved
    aside and reported through `log`, module docstring).

    `abstract_state` is a pytree of `jax.ShapeDtypeStruct`s carrying the target
    shardings, so a checkpoint written on one mesh restores onto another.
    """
    if step is not None:
      if step not in self.all_steps():  # else orbax's "not found" deep in a metadata error
        raise CheckpointError(f"no checkpoint of step {step} in {self.directory}; its steps are "
                              f"{self.all_steps() or 'none'}: pass one of them, or no step for "
                              "the latest")
      return self._restore_step(abstract_state, step)
    damaged: list[tuple[int, _Damaged]] = []
    for candidate in sorted(self.all_steps(), reverse=True):
      try:
        restored = self._restore_step(abstract_state, candidate)
      except _Damaged as error:
        damaged.append((candidate, error))
        continue
      for bad, error in damaged:
        moved = self._move_aside(bad)
        log(f"{error}. Moved it to {moved} (kept for inspection) and resuming from step "
            f"{candidate}, the newest checkpoint that restores; the steps after it are "
            "trained again.")
      if damaged:
        self._manager.reload()  # forget the moved steps
      return restored
    if not damaged:
      raise CheckpointError(f"no finished checkpoint in {self.directory}")
    raise CheckpointError(
        f"no checkpoint in {self.directory} restores: " + "; ".join(str(e) for _, e in damaged)
        + ". Repair or remove them, or start afresh with another checkpoint.directory.")

  def _move_aside(self, step: int) -> Any:
    """Renames checkpoint `step` to `corrupt-<step>-<UTC time>` beside it (process 0 only:
    the directory is shared between hosts); returns the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = self.directory / f"corrupt-{step}-{stamp}"
    if jax.process_index() == 0:
      (self.directory / str(step)).rename(target)
    return target

  def restore_items(self, target: dict[str, Any], step: int | None = None) -> tuple[dict, dict]:
    """(the `target` fields of the train state of checkpoint `step` (default: the
    latest), meta). `target` maps `TrainState` field names to abstract trees with
    shardings (e.g. {"policy_params": params}); only those leaves are read (orbax's
    partial restore): the rest of the state (critic, optimizer states) is never
    loaded, and each leaf is read straight onto its shards. The meta is checked as
    `restore` checks it; nothing is moved aside."""
    if step is None:
      step = self.latest_step()
      if step is None:
        raise CheckpointError(f"no finished checkpoint in {self.directory}")
    elif step not in self.all_steps():
      raise CheckpointError(f"no checkpoint of step {step} in {self.directory}; its steps are "
                            f"{self.all_steps() or 'none'}: pass one of them, or no step for "
                            "the latest")
    meta = self._checked_meta(step)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
              item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
              partial_restore=True)))
    except Exception as error:
      raise CheckpointError(f"checkpoint {self.directory / str(step)} does not restore "
                            f"{sorted(target)}: {plain_error(error)}") from error
    return restored["state"], meta

  def _checked_meta(self, step: int) -> dict:
    """The meta of checkpoint `step`; _Damaged if it does not read, CheckpointError
    if it is of another model, LoRA layout or format than this run's config."""
    path = self.directory / str(step)
    try:
      meta = self._manager.restore(step, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore()))["meta"]
    except Exception as error:  # orbax raises many types for unreadable files
      raise _Damaged(f"checkpoint {path} does not restore (its metadata): "
                     f"{plain_error(error)}") from error
    saved_model = as_this_version(meta.get("config", {}).get("model", {}), self._config.model)
    diffs = _describe_difference(saved_model, dataclasses.asdict(self._config.model), "model.")
    diffs += _lora_difference(meta.get("config", {}).get("lora"), self._config.lora)
    if meta.get("format") != FORMAT_VERSION or diffs:
      raise CheckpointError(
          f"checkpoint {path} does not match this run: "
          + ("; ".join(diffs) or f"format {meta.get('format')} != {FORMAT_VERSION}")
          + ". Point checkpoint.directory elsewhere or restore with the original model config.")
    return meta

  def _restore_step(self, abstract_state: Any, step: int) -> tuple[Any, dict, dict]:
    path = self.directory / str(step)
    meta = self._checked_meta(step)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    except Exception as error:
      raise _Damaged(f"checkpoint {path} does not restore into this train state: "
                     f"{plain_error(error)}") from error
    return restored["state"], restored["data"], meta

  def due(self, step: int) -> bool:
    """Whether `save(step)` without `force` would write a checkpoint."""
    return step not in self._manager.all_steps() and self._manager.should_save(step)

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
