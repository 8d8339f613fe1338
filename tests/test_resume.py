"""`run.resume` (`sao_jax.jobs.train.resume_decision`): never / auto / always against an
existing checkpoint directory, on local disk and on an emulated gs:// bucket."""

import dataclasses
import pathlib
import typing

import fsspec
import jax.numpy as jnp
import pytest

from sao_jax import storage
from sao_jax.config import apply_overrides, load_config, versions
from sao_jax.jobs import train
from sao_jax.run.checkpoint import Checkpointer

DEMO = pathlib.Path(__file__).parents[1] / "configs" / "demo_cpu.py"


class _State(typing.NamedTuple):  # what Checkpointer.save needs of a train state
  policy_version: jnp.ndarray
  weights: jnp.ndarray


def _config(run_dir, *overrides):
  return load_config(DEMO, [f"run.run_dir={run_dir}", *overrides]).with_run_paths()


def _checkpoint(cfg, step=2):
  checkpointer = Checkpointer(cfg, writer=True)
  try:
    checkpointer.save(step, _State(jnp.array(1), jnp.zeros(3)), {"position": step}, force=True)
  finally:
    checkpointer.close()


def test_resume_modes_on_an_empty_directory_start_fresh(tmp_path):
  lines = []
  for mode in ("never", "auto", "always"):
    assert train.resume_decision(_config(tmp_path, f"run.resume={mode}"), lines.append) is False
  assert len(lines) == 2 and all("starting from step 0" in line for line in lines)


def test_a_killed_save_is_no_checkpoint(tmp_path):
  cfg = _config(tmp_path)
  pathlib.Path(cfg.checkpoint.directory, "4.orbax-checkpoint-tmp-1234").mkdir(parents=True)
  assert train.resume_decision(cfg, print) is False  # "never" does not refuse it


def test_auto_resumes_the_same_run_and_refuses_another(tmp_path):
  cfg = _config(tmp_path, "run.resume=auto")
  _checkpoint(cfg)
  assert train.resume_decision(cfg) is True
  # Longer, with other samplers, evaluation and checkpoint schedule: the same run.
  same = _config(tmp_path, "run.resume=auto", "learner.steps=500", "sampler.slots=4",
                 "run.eval_every=0", "checkpoint.save_every_steps=7", "learner.micro_batches=2")
  assert train.resume_decision(same) is True
  other = _config(tmp_path, "run.resume=auto", "learner.policy_lr=0.5", "seed=3")
  with pytest.raises(ValueError) as error:
    train.resume_decision(other)
  message = str(error.value)
  assert "holds checkpoints of another config" in message
  assert "learner.policy_lr: checkpoint 0.0001, now 0.5" in message and "seed: checkpoint 0, now 3" in message
  assert "--resume" in message and "run.run_dir=ANOTHER_DIR" in message
  # "always" continues whatever changed (a new phase of a schedule); "never" refuses.
  assert train.resume_decision(apply_overrides(other, ["run.resume=always"])) is True
  with pytest.raises(ValueError, match="already holds checkpoints; pass --resume auto"):
    train.resume_decision(apply_overrides(other, ["run.resume=never"]))


def test_resume_differences_reads_tuples_as_the_json_lists_saved():
  cfg = load_config(DEMO)
  saved = {**dataclasses.asdict(cfg)}
  saved["data"] = {"length_buckets": [1]}  # not an identity section
  import json
  saved = json.loads(json.dumps(saved))
  assert train.resume_differences(saved, cfg) == []
  saved["model"]["mlp_only_layers"] = [1]
  assert train.resume_differences(saved, cfg) == ["model.mlp_only_layers: checkpoint [1], now []"]


def test_a_config_saved_by_another_version_differs_only_where_it_really_does():
  """A run preempted before an upgrade: its saved config has a field since removed
  (`model.hf_path`, unset) and lacks fields since added, each at its default
  (`learner.weight_decay`; `env.dataset`, a whole nested section). The old code named
  all three ("model.hf_path: checkpoint None, now '<missing>'", ...)."""
  import json
  cfg = load_config(DEMO)
  saved = json.loads(json.dumps(dataclasses.asdict(cfg)))
  saved["model"]["hf_path"] = None
  del saved["learner"]["weight_decay"], saved["env"]["dataset"]
  assert train.resume_differences(saved, cfg) == []
  saved["model"]["hf_path"] = "Qwen/Qwen3-0.6B"  # set: the new code cannot honour it
  assert train.resume_differences(saved, cfg) == [
      "model.hf_path: checkpoint 'Qwen/Qwen3-0.6B', now '<missing>'"]
  del saved["model"]["hf_path"]
  launched = apply_overrides(cfg, ["learner.weight_decay=0.5"])  # an added field, set
  assert train.resume_differences(saved, launched) == [
      f"learner.weight_decay: checkpoint {cfg.learner.weight_decay!r}, now 0.5"]


def test_a_removed_field_saved_at_its_last_default_is_no_difference():
  """A removed field saved at the default it had when it went (`model.remat` False,
  `env.tool_site_packages` False, `env.tool_memory_mb` 1024) is what this version does
  without it. The old code dropped only a saved None and refused these runs
  ("model.remat: checkpoint False, now '<missing>'")."""
  import json
  cfg = load_config(DEMO)
  saved = json.loads(json.dumps(dataclasses.asdict(cfg)))
  saved["model"].update(remat=False, hf_path=None)
  saved["env"].update(tool_site_packages=False, tool_memory_mb=1024, tool_wall_time_s=10)
  assert train.resume_differences(saved, cfg) == []
  assert versions.as_this_version(saved["env"], cfg.env) == json.loads(
      json.dumps(dataclasses.asdict(cfg.env)))
  saved["model"]["remat"] = True  # set: this version has no such switch
  saved["env"]["tool_memory_mb"] = 4096
  assert train.resume_differences(saved, cfg) == [
      "model.remat: checkpoint True, now '<missing>'",
      "env.tool_memory_mb: checkpoint 4096, now '<missing>'"]
  saved["model"]["remat"], saved["env"]["tool_memory_mb"] = False, 1024
  saved["model"]["gone_unlisted"] = False  # a field no version here had: kept and named
  assert train.resume_differences(saved, cfg) == [
      "model.gone_unlisted: checkpoint False, now '<missing>'"]


def test_the_removed_fields_table_lists_only_fields_the_classes_no_longer_have():
  for cls, removed in versions.REMOVED.items():
    assert removed and not set(removed) & {field.name for field in dataclasses.fields(cls)}, cls


def test_a_bucket_checkpoint_directory_is_looked_up_in_the_bucket(tmp_path, emulated_gcs):
  cfg = _config(tmp_path, "checkpoint.directory=gs://bucket/run/ckpt", "run.resume=never")
  assert train.resume_decision(cfg) is False
  emulated_gcs.pipe("gs://bucket/run/ckpt/3.orbax-checkpoint-tmp-9/x", b"partial")
  assert train.resume_decision(cfg) is False
  emulated_gcs.pipe("gs://bucket/run/ckpt/10/_CHECKPOINT_METADATA", b"{}")
  with pytest.raises(ValueError, match="gs://bucket/run/ckpt already holds checkpoints"):
    train.resume_decision(cfg)
  assert not (tmp_path / "gs:").exists()  # nothing went to a local gs:/ directory


def test_a_bucket_url_without_its_filesystem_names_the_package(monkeypatch):
  monkeypatch.setattr(fsspec, "registry", {})
  monkeypatch.setattr(storage.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(ValueError, match=r"'gs://b/ckpt' is a gs:// URL, which needs the gcsfs "
                     r"package .* pip install 'sao-jax\[gcs\]'"):
    storage.storage_path("gs://b/ckpt")
  assert str(storage.storage_path("relative/dir")).startswith("/")
