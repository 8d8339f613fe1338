"""Experiment tracking: `run.loggers`, the Weights & Biases logger in offline mode,
and a clear error when it is selected but not installed."""

import json
import sys

import pytest

from sao_jax.config import RunConfig
from sao_jax.run import metrics


@pytest.mark.slow  # starts W&B's service process: ~6 s on 2 busy cores
def test_wandb_logger_offline_logs_every_row_against_the_learner_step(tmp_path, monkeypatch):
  wandb = pytest.importorskip("wandb")  # the `wandb` extra (in `dev`)
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  # pytest replaces sys.stdout; W&B's console capture wrapped around it keeps the run from
  # flushing at finish(). A run under sao-train writes to the real streams.
  monkeypatch.setenv("WANDB_CONSOLE", "off")
  logger = metrics.MetricsLogger(tmp_path, total_steps=3, loggers=("wandb",),
                                 wandb_project="sao-test", name="tiny", config={"seed": 7})
  run = logger._wandb.run
  logger.write(-2, {"sft/loss": 2.5})  # SFT rows come before step 0
  logger.write(0, {"reward/mean": 0.25})
  logger.write(1, {"reward/mean": 0.5, "eval/accuracy": 0.75})
  summary = dict(run.summary)
  assert run.settings.mode == "offline" and run.project == "sao-test" and run.name == "tiny"
  assert run.config["seed"] == 7
  assert summary["sft/loss"] == 2.5 and summary["reward/mean"] == 0.5
  assert summary["eval/accuracy"] == 0.75 and summary["learner_step"] == 1
  logger.close()
  # finish() has delivered every row; the W&B service writes the run file when its
  # stream closes, which teardown (at exit in a real run) waits for.
  wandb.teardown()
  [offline_run] = (tmp_path / "wandb").glob("offline-run-*")
  [records] = offline_run.glob("run-*.wandb")
  data = records.read_bytes()
  assert [key for key in (b"sft/loss", b"reward/mean", b"learner_step") if key not in data] == []
  # Only the chosen loggers: no TensorBoard events, and metrics.jsonl as always.
  assert not (tmp_path / metrics.TENSORBOARD_DIR).exists()
  rows = [json.loads(line) for line in (tmp_path / metrics.METRICS_FILE).read_text().splitlines()]
  assert [row["step"] for row in rows] == [-2, 0, 1]


def test_wandb_selected_but_not_installed_says_how_to_install(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
  with pytest.raises(ValueError, match=r"run.loggers includes 'wandb'.*sao-jax\[wandb\]"):
    metrics.MetricsLogger(tmp_path, total_steps=1, loggers=("tensorboard", "wandb"))
  assert not (tmp_path / metrics.TENSORBOARD_DIR).exists()  # refused before writing anything


def test_loggers_config_names_the_allowed_values():
  RunConfig(loggers=()).validate()
  RunConfig(loggers=("tensorboard", "wandb")).validate()
  for bad in [("mlflow",), ("tensorboard", "tensorboard"), "wandb"]:
    with pytest.raises(ValueError, match=r"run.loggers=.* 'tensorboard', 'wandb'"):
      RunConfig(loggers=bad).validate()
  with pytest.raises(ValueError, match=r"run.wandb_project=''"):
    RunConfig(loggers=("wandb",), wandb_project="").validate()


def test_eval_sampling_config_is_checked():
  RunConfig(eval_samples=8, eval_pass_k=(1, 4, 8)).validate()
  RunConfig(eval_samples=0, eval_pass_k=(16,)).validate()  # greedy only: k unused
  for ks in [(1, 16), (4, 1), (0,), ()]:
    with pytest.raises(ValueError, match=r"run.eval_pass_k=.*1..run.eval_samples=8"):
      RunConfig(eval_samples=8, eval_pass_k=ks).validate()
  with pytest.raises(ValueError, match=r"run.eval_temperature=0"):
    RunConfig(eval_temperature=0).validate()
