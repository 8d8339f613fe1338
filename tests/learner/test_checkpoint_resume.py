"""Checkpoints: resume equals an uninterrupted run, SIGTERM, other meshes, bad checkpoints."""

import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from learner_fixtures import make_batch, make_config
from sao_jax import config as C
from sao_jax.learner import compile as compile_lib
from sao_jax.learner.loop import run_learner
from sao_jax.learner.state import abstract_state
from sao_jax.run import metrics as metrics_lib
from sao_jax.run.checkpoint import Checkpointer, CheckpointError
from sao_jax.run.timing import RunClock
from sao_jax.sharding.mesh import make_mesh

HERE = pathlib.Path(__file__).resolve().parent


class Batches:
  """A deterministic, resumable batch iterator (what a grain iterator provides)."""

  def __init__(self, limit=None, delay=0.0):
    self.position, self.limit, self.delay = 0, limit, delay

  def __next__(self):
    if self.limit is not None and self.position >= self.limit:
      raise StopIteration
    time.sleep(self.delay)
    self.position += 1
    return make_batch(100 + self.position, behavior_shift=0.2)

  def get_state(self):
    return {"position": self.position}

  def set_state(self, state):
    self.position = state["position"]


def config(directory, steps, **checkpoint):
  cfg = make_config(steps=steps, critic_warmup_steps=1)
  return dataclasses.replace(cfg, checkpoint=C.CheckpointConfig(
      directory=str(directory), **{"save_every_steps": 2, "keep": 2, **checkpoint}))


def host_leaves(state):
  return [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(state)]


def assert_bitwise_equal(a, b):
  for x, y in zip(host_leaves(a), host_leaves(b)):
    np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  cfg = config(tmp_path_factory.mktemp("full"), steps=5)
  return run_learner(cfg, Batches())


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
  """The checkpoint directory of a 2-step run (latest checkpoint: step 2), made once."""
  directory = tmp_path_factory.mktemp("two_steps")
  run_learner(config(directory, steps=2), Batches())
  return directory


def copy_of(two_steps, tmp_path):
  """A fresh copy of the 2-step run's checkpoints in `tmp_path`, for a test to damage."""
  shutil.copytree(two_steps, tmp_path, dirs_exist_ok=True)
  return config(tmp_path, steps=2)


def test_resume_equals_uninterrupted_run(tmp_path, uninterrupted):
  first = run_learner(config(tmp_path, steps=3), Batches())
  assert first.steps_done == 3 and first.stopped_by == "steps"
  assert Checkpointer(config(tmp_path, steps=5)).all_steps() == [2, 3]  # keep = 2
  resumed = run_learner(config(tmp_path, steps=5), Batches())
  assert resumed.steps_done == 5
  assert_bitwise_equal(resumed.state, uninterrupted.state)


def test_sigterm_saves_and_the_run_resumes(tmp_path, uninterrupted):
  script = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import jax
jax.config.update("jax_num_cpu_devices", 8)
from test_checkpoint_resume import Batches, config
from sao_jax.learner.loop import run_learner
result = run_learner(config({str(tmp_path)!r}, steps=5, save_every_steps=100), Batches(delay=0.5),
                     on_metrics=lambda step, m: print("step", step, flush=True))
print("stopped", result.stopped_by, result.steps_done, flush=True)
"""
  proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  lines = []
  for line in proc.stdout:
    lines.append(line.strip())
    if line.startswith("step 0"):
      proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=120) == 0, lines
  stopped = [l for l in lines if l.startswith("stopped")]
  assert stopped and stopped[0].split()[1] == "preemption", lines
  steps_done = int(stopped[0].split()[2])
  assert steps_done < 5
  assert Checkpointer(config(tmp_path, steps=5)).latest_step() == steps_done
  resumed = run_learner(config(tmp_path, steps=5), Batches())
  assert_bitwise_equal(resumed.state, uninterrupted.state)


def test_sigterm_during_a_save_stops_at_a_saved_step(tmp_path, monkeypatch):
  """Regression: SIGTERM landing inside an off-schedule save used to stop the run one
  step past its last checkpoint (the flag was read twice: once to force the save,
  once to stop)."""
  real_save = Checkpointer.save

  def save_then_signal(self, step, *args, **kwargs):
    saved = real_save(self, step, *args, **kwargs)
    if step == 2:
      os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode: after this save
    return saved

  monkeypatch.setattr(Checkpointer, "save", save_then_signal)
  result = run_learner(config(tmp_path, steps=5, save_every_steps=100), Batches())
  assert result.stopped_by == "preemption"
  assert Checkpointer(config(tmp_path, steps=5)).latest_step() == result.steps_done


def test_wall_clock_budget_stops_with_a_final_checkpoint(tmp_path):
  """run.max_wall_s: each batch takes 1 s (a fake clock), the budget is 2.5 s: the run
  stops after the step whose batch came at 3 s, saves that step although no save is
  due, and says why; every row carries the elapsed time."""
  now = {"t": 0.0}

  class SlowBatches(Batches):
    def __next__(self):
      now["t"] += 1.0
      return super().__next__()

  cfg = config(tmp_path, steps=10, save_every_steps=100)
  cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, max_wall_s=2.5))
  rows = {}
  result = run_learner(cfg, SlowBatches(), on_metrics=lambda step, m: rows.update({step: m}),
                       clock=lambda: RunClock(clock=lambda: now["t"]))
  assert (result.stopped_by, result.steps_done) == ("wall_clock", 3)
  assert Checkpointer(cfg).latest_step() == 3
  assert [rows[s]["time/elapsed_s"] for s in sorted(rows)] == [1.0, 2.0, 3.0]
  # All the (fake) time passes waiting for batches: the learner is idle throughout.
  assert [rows[s]["learner/idle_frac"] for s in sorted(rows)] == [1.0, 1.0, 1.0]
  assert rows[2]["learner/idle_frac_total"] == 1.0


def test_restore_onto_a_different_mesh(tmp_path):
  cfg = config(tmp_path, steps=2)
  saved = run_learner(cfg, Batches(),
                      mesh=make_mesh(C.MeshConfig(fsdp=8), jax.devices()))
  other = make_mesh(C.MeshConfig(data=2, fsdp=2, tensor=2), jax.devices())
  shardings = compile_lib.state_shardings(cfg, other)
  abstract = jax.tree.map(lambda leaf, sh: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                                sharding=sh),
                          abstract_state(cfg), shardings)
  restored, data_state, meta = Checkpointer(cfg).restore(abstract)
  assert data_state == {"position": 2} and meta["step"] == 2
  assert_bitwise_equal(restored, saved.state)
  for leaf, sharding in zip(jax.tree.leaves(restored), jax.tree.leaves(shardings)):
    assert leaf.sharding == sharding


def test_half_written_checkpoint_is_never_picked_up(tmp_path, two_steps):
  cfg = copy_of(two_steps, tmp_path)
  # What a crash mid-save leaves behind: orbax's temporary directory for step 4.
  partial = tmp_path / "4.orbax-checkpoint-tmp-1234"
  (partial / "state").mkdir(parents=True)
  (partial / "state" / "garbage").write_bytes(b"\x00" * 10)
  assert Checkpointer(cfg).latest_step() == 2


def test_checkpoint_of_another_model_shape_is_named(tmp_path, two_steps):
  cfg = copy_of(two_steps, tmp_path)
  bigger = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hidden_size=64))
  with pytest.raises(CheckpointError, match=r"model.hidden_size: checkpoint 32 vs config 64"):
    run_learner(dataclasses.replace(bigger, learner=dataclasses.replace(bigger.learner, steps=3)),
                Batches())


def _edit_saved_model(directory, edit) -> None:
  """Rewrites the model section every checkpoint's meta recorded, as an older or newer
  version of the config class would have written it."""
  for path in directory.glob("*/meta/metadata"):
    meta = json.loads(path.read_text())
    edit(meta["config"]["model"])
    path.write_text(json.dumps(meta))


def test_a_checkpoint_of_another_version_resumes_when_only_unset_or_new_fields_differ(
    tmp_path, two_steps):
  """What an upgrade between a preemption and the relaunch leaves: the checkpoint's
  model section has a field since removed (`hf_path`, unset) and lacks one since added
  (here `rope_truncate`, at its default). The old code refused ("model.hf_path:
  checkpoint None vs config '<missing>'")."""
  cfg = copy_of(two_steps, tmp_path)

  def older(model):
    model["hf_path"] = None
    del model["rope_truncate"]

  _edit_saved_model(tmp_path, older)
  state, _, meta = Checkpointer(cfg).restore(abstract_state(cfg))
  assert meta["step"] == 2 and jax.tree.leaves(state)


@pytest.mark.parametrize("edit, named", [
    (lambda model: model.update(hf_path="Qwen/Qwen3-0.6B"),
     "model.hf_path: checkpoint 'Qwen/Qwen3-0.6B' vs config '<missing>'"),
    (lambda model: model.update(rope_truncate=False), "model.rope_truncate: checkpoint False vs "
     "config True"),
])
def test_a_removed_field_that_was_set_or_a_changed_field_is_still_refused(tmp_path, two_steps,
                                                                          edit, named):
  cfg = copy_of(two_steps, tmp_path)
  _edit_saved_model(tmp_path, edit)
  with pytest.raises(CheckpointError, match=re.escape(named)):
    Checkpointer(cfg).restore(abstract_state(cfg))


def test_corrupt_checkpoints_are_named_and_left_in_place(tmp_path, two_steps):
  """When no checkpoint restores, each one's problem is named and nothing is moved."""
  cfg = copy_of(two_steps, tmp_path)
  steps = Checkpointer(cfg).all_steps()
  for step in steps:
    state_dir = tmp_path / str(step) / "state"
    for path in state_dir.rglob("*"):
      if path.is_file() and "manifest" in path.name or path.name.endswith(".zarray"):
        path.unlink()
    for path in list(state_dir.rglob("*")):
      if path.is_file():
        path.write_bytes(b"corrupt")
  with pytest.raises(CheckpointError, match=rf"no checkpoint in {tmp_path} restores: "
                                            rf"checkpoint {tmp_path / str(max(steps))} does "
                                            "not restore"):
    run_learner(dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, steps=3)),
                Batches())
  assert Checkpointer(cfg).all_steps() == steps and not list(tmp_path.glob("corrupt-*"))


@pytest.mark.parametrize("damage", [
    lambda meta: {**meta, "config": None}, lambda meta: {**meta, "config": "a string"},
    lambda meta: {**meta, "config": [1, 2]}, lambda meta: [meta], lambda meta: "meta",
    lambda meta: {**meta, "config": {**meta["config"], "model": None}},
    lambda meta: {**meta, "step": "2"},
    # Before: read as that other step: sao-eval reported it, sao-convert read the value
    # model of it beside the policy of this directory's step.
    lambda meta: {**meta, "step": meta["step"] - 1}, lambda meta: {**meta, "step": 10**30},
], ids=["config-null", "config-string", "config-list", "meta-list", "meta-string",
        "model-null", "step-string", "step-of-another-directory", "step-huge"])
def test_a_checkpoint_whose_meta_has_the_wrong_type_is_damaged(tmp_path, two_steps, damage):
  """Saved meta that is not the JSON object `save` writes is damage, like a truncated
  array: skipped by a reader (left in place), moved aside by the writer, the previous
  step restored. Before: AttributeError ('NoneType' object has no attribute 'get')."""
  cfg = copy_of(two_steps, tmp_path)
  *_, previous, newest = Checkpointer(cfg).all_steps()
  path = tmp_path / str(newest) / "meta" / "metadata"
  damaged = json.dumps(damage(json.loads(path.read_text())))
  path.write_text(damaged)
  saved_previous = json.loads((tmp_path / str(previous) / "meta" / "metadata").read_text())

  reader, messages = Checkpointer(cfg), []
  _, _, meta = reader.restore(abstract_state(cfg), log=messages.append)
  assert meta["step"] == previous and reader.saved_config() == saved_previous["config"]
  [message] = messages
  assert message.startswith(f"checkpoint {tmp_path / str(newest)} does not restore (its "
                            "metadata): its meta")
  assert "not the JSON object saved. Skipped it (left in place" in message
  assert f"read step {previous}" in message
  assert reader.all_steps()[-1] == newest and not list(tmp_path.glob("corrupt-*"))

  messages.clear()
  _, _, meta = Checkpointer(cfg, writer=True).restore(abstract_state(cfg), log=messages.append)
  assert meta["step"] == previous
  [moved] = tmp_path.glob(f"corrupt-{newest}-*")
  assert (moved / "meta" / "metadata").read_text() == damaged  # kept for inspection
  [message] = messages
  assert f"Moved it to {moved}" in message and f"resuming from step {previous}" in message
  assert Checkpointer(cfg).all_steps()[-1] == previous


def truncate_arrays(checkpoint_dir):
  """What a full disk or an interrupted copy leaves: every array file of the state cut in half."""
  files = [p for p in (checkpoint_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  assert files
  for path in files:
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def test_damaged_newest_checkpoint_falls_back_to_the_newest_that_restores(tmp_path,
                                                                          uninterrupted):
  """Regression: a truncated newest checkpoint blocked resuming (with a TensorStore spec
  dump as the message) although the checkpoint before it was fine."""
  run_learner(config(tmp_path, steps=4), Batches())  # checkpoints 2 and 4
  truncate_arrays(tmp_path / "4")
  files = sorted(p.relative_to(tmp_path / "4") for p in (tmp_path / "4").rglob("*"))
  messages = []
  resumed = run_learner(config(tmp_path, steps=5), Batches(), log=messages.append)
  assert resumed.steps_done == 5
  assert_bitwise_equal(resumed.state, uninterrupted.state)  # steps 3 and 4 trained again
  [moved] = tmp_path.glob("corrupt-4-*")
  assert sorted(p.relative_to(moved) for p in moved.rglob("*")) == files  # kept whole
  [message] = messages
  assert message.startswith(f"checkpoint {tmp_path / '4'} does not restore")
  assert "is not valid for value of size" in message and f"Moved it to {moved}" in message
  assert "resuming from step 2" in message
  assert "tensorstore_spec" not in message and len(message) < 1000


class Crash(Exception):
  """A kill right after a checkpoint is written."""


def test_metrics_of_every_step_are_out_before_its_checkpoint(tmp_path, monkeypatch):
  """Regression: step N's metrics were reported after step N+1 was dispatched, which is
  after the checkpoint at N+1 was saved; a kill in between lost them for good (a run
  resumed from that checkpoint does not train step N again)."""
  real_save = Checkpointer.save

  def save_then_crash(self, step, *args, **kwargs):
    saved = real_save(self, step, *args, **kwargs)
    if saved:
      self.wait()
      raise Crash(step)
    return saved

  monkeypatch.setattr(Checkpointer, "save", save_then_crash)
  reported = []
  with pytest.raises(Crash):
    run_learner(config(tmp_path, steps=5, async_save=False), Batches(),
                on_metrics=lambda step, m: reported.append(step))
  monkeypatch.undo()
  saved = Checkpointer(config(tmp_path, steps=5)).latest_step()
  assert saved and reported == list(range(saved))  # orbax saves the first step too


def event_scalars(directory):
  """(tag, step) of every scalar in the TensorBoard event files of `directory`, by file
  (TFRecord framing: length u64, crc u32, payload, crc u32)."""
  from tensorboardX.proto import event_pb2

  scalars = {}
  for path in sorted(directory.glob("events.out.tfevents.*")):
    data, offset, found = path.read_bytes(), 0, []
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset:offset + 8])
      event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
      offset += 16 + length
      found += [(value.tag, event.step) for value in event.summary.value]
    scalars[path.name] = found
  return scalars


def test_resumed_metrics_hold_each_step_once(tmp_path):
  """After a kill at step 5 and a resume from the checkpoint at step 3, the rows of
  steps 3 and 4 (and the evaluation at 4) are written again: the file, TensorBoard and
  the plot must hold them once, the new values."""
  logger = metrics_lib.MetricsLogger(tmp_path, total_steps=6)
  logger.write(-1, {"sft/loss": 2.0})
  for step in range(5):
    logger.write(step, {"reward/mean": 0.1 * step})
    if step % 2 == 0:
      logger.write(step, {"eval/accuracy": 0.5})
  logger.close()
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 5, "reward/me')  # torn by the kill
  resumed = metrics_lib.MetricsLogger(tmp_path, total_steps=6)
  resumed.rewind(3)
  for step in range(3, 6):
    resumed.write(step, {"reward/mean": 1.0})
    if step % 2 == 0:
      resumed.write(step, {"eval/accuracy": 0.9})
  resumed.close()

  rows = metrics_lib.read_metrics(tmp_path)
  train = [(r["step"], r["reward/mean"]) for r in rows if "reward/mean" in r]
  assert train == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 1.0), (4, 1.0), (5, 1.0)]
  assert [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r] == [
      (0, 0.5), (2, 0.5), (4, 0.9)]
  assert [r["step"] for r in rows if "sft/loss" in r] == [-1]
  [(name, scalars)] = event_scalars(tmp_path / "tensorboard").items()
  assert name.endswith(f".resumed-at-3.{os.getpid()}")
  assert len(scalars) == len(set(scalars)) == 10
  assert metrics_lib.plot_curves(tmp_path).stat().st_size > 0

  # A fresh run in the same directory (killed before its first checkpoint) starts over.
  again = metrics_lib.MetricsLogger(tmp_path, total_steps=6)
  again.rewind(None)
  again.write(-1, {"sft/loss": 1.5})
  again.close()
  assert [(r["step"], r["sft/loss"]) for r in metrics_lib.read_metrics(tmp_path)] == [(-1, 1.5)]
  [(name, scalars)] = event_scalars(tmp_path / "tensorboard").items()
  assert scalars == [("sft/loss", -1)]


def test_a_step_without_a_checkpoint_names_the_steps_there(two_steps):
  # Before: "checkpoint .../7 does not restore (its metadata): Checkpoint at ... not found".
  cfg = config(two_steps, steps=2)
  steps = Checkpointer(cfg).all_steps()
  with pytest.raises(CheckpointError, match=rf"no checkpoint of step 7 in .*; its steps are "
                                            rf"{re.escape(str(steps))}: pass one of them"):
    Checkpointer(cfg).restore(None, step=7)
