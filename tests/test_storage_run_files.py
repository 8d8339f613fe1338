"""A run's files in a bucket (`sao_jax.storage`): metrics, plot, evaluation transcripts
and reports written whole to an emulated gs:// bucket and read back, a resumed run's
metrics there without the rows it replays, and what needs local files refused by name
instead of landing in a local `gs:/bucket` directory."""

import json
import os
import pathlib

import numpy as np
import pytest

from sao_jax import storage
from sao_jax.cli import evaluate as evaluate_cli
from sao_jax.config import Config, RunConfig, load_config
from sao_jax.jobs import eval_scores
from sao_jax.jobs import evaluate as evaluation
from sao_jax.run import metrics as metrics_lib
from sao_jax.types import Trajectory
from tiny_run import TINY_RUN as TINY

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo_cpu.py"
RUN = "gs://bucket/run"
# What a bucket run sets besides run.run_dir (config.run refuses the rest).
BUCKET_RUN = [f"run.run_dir={RUN}", "run.loggers=", "run.tokenizer=/models/tokenizer.json"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
  """An empty working directory, where pathlib would put a `gs:/bucket` directory."""
  monkeypatch.chdir(tmp_path)
  return tmp_path


def test_local_writes_are_renamed_into_place(tmp_path):
  path = tmp_path / "eval" / "step_3.json"
  storage.write_atomic(path, b"old")
  storage.write_atomic(path, b"new")
  assert path.read_bytes() == b"new" and os.listdir(path.parent) == ["step_3.json"]
  (tmp_path / "taken").mkdir()
  (tmp_path / "taken" / "x").write_text("x")
  with pytest.raises(OSError):  # a directory in the way: the rename fails
    storage.write_atomic(tmp_path / "taken", b"new")
  assert not (tmp_path / f"taken{storage.PARTIAL_SUFFIX}").exists()  # nothing left behind


def test_a_bucket_file_is_one_object_and_nothing_local(emulated_gcs, workdir):
  storage.write_atomic(storage.as_path(f"{RUN}/eval/step_3.json"), b"{}")
  assert emulated_gcs.cat(f"{RUN}/eval/step_3.json") == b"{}"
  assert emulated_gcs.find(RUN) == [f"{RUN}/eval/step_3.json"]  # no temporary object
  assert storage.join(RUN + "/", "checkpoints") == f"{RUN}/checkpoints"
  assert storage.join("runs/a", "checkpoints") == "runs/a/checkpoints"
  assert os.listdir(workdir) == []


def kill_and_resume(run_dir) -> list[dict]:
  """Steps 0-4 logged (evaluations at even steps), the process killed without closing
  its logger, then a run resumed from the checkpoint at step 3 logs steps 3-5: the
  rows of the file after that, times left out."""
  logger = metrics_lib.MetricsLogger(run_dir, total_steps=6, loggers=())
  logger.write(-1, {"sft/loss": 2.0})
  for step in range(5):
    logger.write(step, {"reward/mean": 0.1 * step})
    if step % 2 == 0:
      logger.write(step, {"eval/accuracy": 0.5})
  assert len(metrics_lib.read_metrics(run_dir)) == 9  # each row is out as it is written
  resumed = metrics_lib.MetricsLogger(run_dir, total_steps=6, loggers=())
  resumed.rewind(3)
  for step in range(3, 6):
    resumed.write(step, {"reward/mean": 1.0})
    if step % 2 == 0:
      resumed.write(step, {"eval/accuracy": 0.9})
  resumed.close()
  return [{k: v for k, v in row.items() if k != "time"}
          for row in metrics_lib.read_metrics(run_dir)]


def test_metrics_in_a_bucket_resume_without_the_replayed_rows(emulated_gcs, workdir):
  rows = kill_and_resume(RUN)
  assert [(r["step"], r["reward/mean"]) for r in rows if "reward/mean" in r] == [
      (0, 0.0), (1, 0.1), (2, 0.2), (3, 1.0), (4, 1.0), (5, 1.0)]
  assert [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r] == [
      (0, 0.5), (2, 0.5), (4, 0.9)]
  assert [r["step"] for r in rows if "sft/loss" in r] == [-1]
  assert rows == kill_and_resume(workdir / "local")  # the rows local disk ends with
  assert str(metrics_lib.plot_curves(RUN)) == f"{RUN}/curves.png"
  assert emulated_gcs.cat(f"{RUN}/curves.png").startswith(b"\x89PNG")
  # A fresh run in the same bucket directory starts its rows over.
  again = metrics_lib.MetricsLogger(RUN, total_steps=6, loggers=())
  again.rewind(None)
  again.write(-1, {"sft/loss": 1.5})
  again.close()
  assert [(r["step"], r["sft/loss"]) for r in metrics_lib.read_metrics(RUN)] == [(-1, 1.5)]
  assert sorted(os.listdir(workdir)) == ["local"]  # no gs:/ directory beside it


class _Chat:
  """What write_transcripts needs of a chat format: a tokenizer that decodes."""

  class tokenizer:  # pylint: disable=invalid-name

    @staticmethod
    def decode(ids, skip_special_tokens):
      assert not skip_special_tokens
      return " ".join(map(str, ids))


def test_eval_transcripts_go_to_the_bucket_run_directory(emulated_gcs, workdir):
  cfg = Config(run=RunConfig(run_dir=RUN))
  trajs = [Trajectory(tokens=np.array([1, 2, 3]), action_mask=np.array([0, 1, 1], np.int8),
                      behavior_logp=np.zeros(3, np.float32),
                      rewards=np.array([0, 0, reward], np.float32), prompt_id=i,
                      policy_versions=(0, 0), info={"task": f"t{i}", "turns": 1})
           for i, reward in enumerate((1.0, 0.0))]
  evaluation.write_transcripts(evaluation.transcripts_path(cfg, 4), trajs, _Chat())
  text = emulated_gcs.cat(f"{RUN}/eval/episodes_step_4.jsonl").decode()
  assert [json.loads(line) for line in text.splitlines()] == [
      {"task": "t0", "reward": 1.0, "turns": 1, "env_failure": None, "text": "1 2 3"},
      {"task": "t1", "reward": 0.0, "turns": 1, "env_failure": None, "text": "1 2 3"}]
  assert os.listdir(workdir) == []


def test_sao_eval_writes_its_report_into_the_bucket(emulated_gcs, workdir, monkeypatch, capsys):
  report = {"step": 3, "tasks": "2 tasks", "samples": 0, "temperature": None,
            **eval_scores.summarize([eval_scores.TaskScore("a", True),
                                     eval_scores.TaskScore("a", False)], ())}
  monkeypatch.setattr(evaluation, "evaluate_checkpoint", lambda *args, **kwargs: report)
  config = ["--config", str(DEMO)] + [arg for o in BUCKET_RUN for arg in ("--set", o)]
  evaluate_cli.main(config)
  assert json.loads(emulated_gcs.cat(f"{RUN}/eval/step_3.json")) == report
  assert f"report: {RUN}/eval/step_3.json" in capsys.readouterr().out
  evaluate_cli.main(config + ["--output", "gs://bucket/reports/base.json"])
  assert json.loads(emulated_gcs.cat("gs://bucket/reports/base.json")) == report
  assert os.listdir(workdir) == []


def test_a_bucket_without_its_filesystem_names_the_package(workdir, monkeypatch):
  import fsspec
  monkeypatch.setattr(fsspec, "registry", {})
  monkeypatch.setattr(storage.importlib.util, "find_spec", lambda name: None)
  for use in (lambda: metrics_lib.MetricsLogger(RUN, total_steps=1, loggers=()),
                lambda: metrics_lib.read_metrics(RUN)):
    with pytest.raises(ValueError, match="'gs://bucket/run' is a gs:// URL, which needs the "
                       "gcsfs package"):
      use()
  assert os.listdir(workdir) == []


def test_a_bucket_run_directory_keeps_its_checkpoints_in_the_bucket(workdir):
  # Before: pathlib joined them to "gs:/bucket/run/checkpoints", a local directory.
  cfg = load_config(DEMO, BUCKET_RUN).with_run_paths()
  assert cfg.checkpoint.directory == f"{RUN}/checkpoints"
  assert cfg.run.tokenizer_file == "/models/tokenizer.json"  # no copy in the bucket
  local = load_config(DEMO, ["run.run_dir=runs/a"])
  assert local.with_run_paths().checkpoint.directory == "runs/a/checkpoints"
  assert local.run.tokenizer_file == "runs/a/tokenizer.json"


@pytest.mark.parametrize("overrides, message", [
    ([f"run.run_dir={RUN}"], r"run.loggers=\('tensorboard',\) is invalid: run.run_dir="
     r"'gs://bucket/run' is a bucket and TensorBoard writes local files; set run.loggers="),
    ([f"run.run_dir={RUN}", "run.loggers="], r"run.tokenizer='' is invalid: run.run_dir="
     r"'gs://bucket/run' is a bucket, which keeps no tokenizer copy .* set run.tokenizer"),
    (["run.tokenizer=gs://bucket/tokenizer.json"], "the tokenizers library reads local files"),
    (["data.transport=directory", "data.transport_dir=gs://bucket/t"],
     r"data.transport_dir='gs://bucket/t' is invalid: the directory transport claims records "
     r"by renaming files, which a bucket cannot do atomically"),
])
def test_what_needs_local_files_is_refused_for_a_bucket(overrides, message, workdir):
  with pytest.raises(ValueError, match=message):
    load_config(DEMO, overrides)
  assert os.listdir(workdir) == []


def test_a_bucket_run_directory_is_refused_for_a_multi_host_learner(workdir, monkeypatch,
                                                                    tmp_path_factory):
  import jax

  from sao_jax.jobs import train
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  # A tokenizer that exists on this host (sao-train refuses a missing one first).
  tokenizer = tmp_path_factory.mktemp("model") / "tokenizer.json"
  tokenizer.write_text("{}")
  with pytest.raises(ValueError, match=r"run.run_dir='gs://bucket/run' is a bucket, which the "
                     r"2 hosts of this learner would share, .* set run.run_dir to a local"):
    train.run(load_config(DEMO, BUCKET_RUN + [f"run.tokenizer={tokenizer}"]))
  assert os.listdir(workdir) == []




@pytest.mark.slow  # two compiled runs with a sampler process each (minutes on 2 cores)
def test_a_run_in_a_bucket_keeps_its_files_there_and_resumes_from_them(emulated_gcs, workdir):
  import shutil

  from sao_jax.jobs import train
  from sao_jax.run import bootstrap
  tokenizer = workdir / "tokenizer.json"  # local: a bucket run keeps no copy
  bootstrap.train_run_tokenizer(load_config(DEMO, TINY), transcripts=50).save(str(tokenizer))
  # Checkpoints stay local here: orbax writes arrays with tensorstore, whose own gs://
  # driver the in-memory bucket does not serve (test_multihost_setup checks the URL).
  overrides = TINY + BUCKET_RUN[:2] + [f"run.tokenizer={tokenizer}",
                                       f"checkpoint.directory={workdir / 'ckpt'}"]
  first = train.run(load_config(DEMO, overrides + ["learner.steps=3"]), resume=False)
  assert first["steps_done"] == 3 and first["plot"] == f"{RUN}/curves.png"
  names = {path.removeprefix(RUN + "/") for path in emulated_gcs.find(RUN)}
  assert {"config.json", "metrics.jsonl", "summary.json", "curves.png",
          "eval/episodes_step_0.jsonl", "eval/episodes_step_2.jsonl"} <= names
  assert json.loads(emulated_gcs.cat(f"{RUN}/config.json"))["run"]["run_dir"] == RUN
  # Killed after step 3 was logged, before its checkpoint: the relaunch trains it again.
  shutil.rmtree(workdir / "ckpt" / "3")
  second = train.run(load_config(DEMO, overrides + ["learner.steps=5"]), resume=True)
  assert second["steps_done"] == 5
  assert json.loads(emulated_gcs.cat(f"{RUN}/summary.json"))["steps_done"] == 5
  rows = metrics_lib.read_metrics(RUN)
  assert [r["step"] for r in rows if "reward/mean" in r] == [0, 1, 2, 3, 4]
  assert [r["step"] for r in rows if "eval/accuracy" in r] == [-2, 0, 2, 4]
  assert sorted(os.listdir(workdir)) == ["ckpt", "tokenizer.json"]  # no local gs:/ directory
