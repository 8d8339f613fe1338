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

Writer and readers: only the learner that holds the run lock (`sao_jax.run.lock`)
opens a checkpoint directory as its writer (`Checkpointer(cfg, writer=True)`), which
creates it, cleans up the temporary directories of saves killed midway, saves, deletes
old steps and moves damaged ones aside. Every other process (`sao-eval`, `sao-convert`,
the `--resume auto` decision) opens it read-only (the default): orbax's `read_only`
manager creates, deletes and renames nothing, so a reader never removes a live
learner's save in progress.

Damage: a finished checkpoint can still be unreadable later (a disk filled up,
a file truncated or overwritten, metadata that is not the JSON object saved, or that
of another step: a step directory renamed or copied over another).
Reading without a step (`restore`, `restore_items`) takes the newest checkpoint
that restores: each newer one that does not is reported in plain words (its path
and what is wrong, without TensorStore's spec dump); the writer moves it aside to
`<directory>/corrupt-<step>-<UTC time>/`, never deleted, so its steps are trained
again, and a reader leaves it where it is. When none restores, nothing is moved
and the error lists every checkpoint's problem. A checkpoint of another model shape
is not damage: it fails at once, naming the differing fields.

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


def _meta_problem(meta: Any, step: int) -> str | None:
  """What makes `meta` (as read from the checkpoint of `step`) other than the JSON object
  `save` writes, or None: it must be an object whose step (that of its directory) and
  policy version are integers and whose config holds a model section (and a lora
  section, or none: older checkpoints)."""
  if not isinstance(meta, dict):
    return f"its meta is {type(meta).__name__} {meta!r:.80}"
  for key in ("step", "policy_version"):
    if not isinstance(meta.get(key), int) or isinstance(meta.get(key), bool):
      return f"its meta's {key} is {meta.get(key)!r:.80}"
  if meta["step"] != step:  # a step directory renamed or copied over another
    return f"its meta's step is {str(meta['step'])[:80]}, in the directory of step {step}"
  config = meta.get("config")
  if not isinstance(config, dict):
    return f"its meta's config is {type(config).__name__} {config!r:.80}"
  for name, optional in (("model", False), ("lora", True)):
    section = config.get(name)
    if not isinstance(section, dict) and not (optional and section is None):
      return f"its meta's config.{name} is {type(section).__name__} {section!r:.80}"
  return None


class Checkpointer:
  """Saves and restores learner checkpoints under `cfg.checkpoint.directory`.

  `writer=True` only in the learner that holds the run lock: it creates the directory,
  cleans up killed saves, saves and moves damaged steps aside. The default opens it
  read-only: nothing there is created, deleted or renamed (module docstring)."""

  def __init__(self, cfg: Config, *, writer: bool = False):
    ckpt: CheckpointConfig = cfg.checkpoint
    if ckpt.directory is None:
      raise ValueError("checkpoint.directory is None; set --set checkpoint.directory=PATH "
                       "to enable checkpoints")
    self._config = cfg
    self.writer = writer
    self.directory = storage_path(ckpt.directory)
    if writer:
      options = ocp.CheckpointManagerOptions(
          max_to_keep=ckpt.keep, save_interval_steps=ckpt.save_every_steps,
          enable_async_checkpointing=ckpt.async_save, create=True, cleanup_tmp_directories=True)
    else:  # orbax's read-only manager: no root made, no temporary directory removed
      options = ocp.CheckpointManagerOptions(
          read_only=True, create=False, cleanup_tmp_directories=False, max_to_keep=None,
          save_interval_steps=0, enable_async_checkpointing=False)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
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
        meta = self._read_meta(step)
      except _Damaged:  # `restore` reports it
        continue
      return meta["config"]
    return None

  def save(self, step: int, state: Any, data_state: dict, *, force: bool = False) -> bool:
    """Saves if `step` is on the schedule (or `force`) and not saved yet; returns
    whether it saved."""
    if not self.writer:
      raise ValueError(f"{self.directory} was opened read-only; only the learner holding the "
                       "run lock saves there (Checkpointer(cfg, writer=True))")
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
    step, of the newest checkpoint that restores (damaged newer ones are reported
    through `log`, and moved aside by the writer, module docstring).

    `abstract_state` is a pytree of `jax.ShapeDtypeStruct`s carrying the target
    shardings, so a checkpoint written on one mesh restores onto another.
    """
    if step is not None:
      if step not in self.all_steps():  # else orbax's "not found" deep in a metadata error
        raise CheckpointError(f"no checkpoint of step {step} in {self.directory}; its steps are "
                              f"{self.all_steps() or 'none'}: pass one of them, or no step for "
                              "the latest")
      return self._restore_step(abstract_state, step)
    return self._newest_that_restores(lambda step: self._restore_step(abstract_state, step),
                                      log)

  def _newest_that_restores(self, read: Callable[[int], Any], log: Callable[[str], None]):
    """`read(step)` of the newest step it does not raise _Damaged for; each newer one is
    reported through `log` and (by the writer only) moved aside."""
    damaged: list[tuple[int, _Damaged]] = []
    for candidate in sorted(self.all_steps(), reverse=True):
      try:
        restored = read(candidate)
      except _Damaged as error:
        damaged.append((candidate, error))
        continue
      for bad, error in damaged:
        if self.writer:
          moved = self._move_aside(bad)
          log(f"{error}. Moved it to {moved} (kept for inspection) and resuming from step "
              f"{candidate}, the newest checkpoint that restores; the steps after it are "
              "trained again.")
        else:
          log(f"{error}. Skipped it (left in place: only the learner holding the run moves "
              f"a damaged checkpoint aside) and read step {candidate}, the newest checkpoint "
              "that restores.")
      if damaged and self.writer:
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

  def restore_items(self, target: dict[str, Any], step: int | None = None, *,
                    log: Callable[[str], None] = print) -> tuple[dict, dict]:
    """(the `target` fields of the train state of checkpoint `step` (default: the
    newest that restores, damaged newer ones reported through `log` as `restore`
    does), meta). `target` maps `TrainState` field names to abstract trees with
    shardings (e.g. {"policy_params": params}); only those leaves are read (orbax's
    partial restore): the rest of the state (critic, optimizer states) is never
    loaded, and each leaf is read straight onto its shards. The meta is checked as
    `restore` checks it."""
    if step is None:
      return self._newest_that_restores(lambda step: self._restore_items_step(target, step),
                                        log)
    if step not in self.all_steps():
      raise CheckpointError(f"no checkpoint of step {step} in {self.directory}; its steps are "
                            f"{self.all_steps() or 'none'}: pass one of them, or no step for "
                            "the latest")
    return self._restore_items_step(target, step)

  def _restore_items_step(self, target: dict[str, Any], step: int) -> tuple[dict, dict]:
    meta = self._checked_meta(step)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
              item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
              partial_restore=True)))
    except Exception as error:
      raise _Damaged(f"checkpoint {self.directory / str(step)} does not restore "
                     f"{sorted(target)}: {plain_error(error)}") from error
    return restored["state"], meta

  def _read_meta(self, step: int) -> dict:
    """The meta of checkpoint `step`; _Damaged if it does not read or is not the JSON
    object `save` writes (`_meta_problem`)."""
    path = self.directory / str(step)
    try:
      meta = self._manager.restore(step, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore()))["meta"]
    except Exception as error:  # orbax raises many types for unreadable files
      raise _Damaged(f"checkpoint {path} does not restore (its metadata): "
                     f"{plain_error(error)}") from error
    problem = _meta_problem(meta, step)
    if problem:
      raise _Damaged(f"checkpoint {path} does not restore (its metadata): {problem}, not the "
                     "JSON object saved")
    return meta

  def _checked_meta(self, step: int) -> dict:
    """The meta of checkpoint `step`; _Damaged if it does not read (`_read_meta`),
    CheckpointError if it is of another model, LoRA layout or format than this run's
    config."""
    path = self.directory / str(step)
    meta = self._read_meta(step)
    saved_model = as_this_version(meta["config"]["model"], self._config.model)
    diffs = _describe_difference(saved_model, dataclasses.asdict(self._config.model), "model.")
    diffs += _lora_difference(meta["config"].get("lora"), self._config.lora)
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
