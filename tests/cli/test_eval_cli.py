"""`sao-eval` flags: sampling settings reach run.eval_*, bad ones exit 2 naming the field."""

import pathlib

import pytest

from sao_jax.cli import evaluate as evaluate_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = ["--config", str(ROOT / "configs" / "demo_cpu.py")]


@pytest.mark.parametrize("args, message", [
    (["--samples", "4", "--pass-k", "1,8"], "run.eval_pass_k=(1, 8) is invalid"),
    (["--samples", "4", "--temperature", "0"], "run.eval_temperature=0.0 is invalid"),
    (["--set", "env.task_source=parquet"], "env.dataset.path='' is invalid"),
    (["--set", "env.task_source=hf_disk", "--set", "env.dataset.path=/nonexistent"],
     "task_source='hf_disk' needs the directory"),
    (["--serve", "--samples", "4"], "--serve scores nothing"),
])
def test_bad_evaluation_settings_exit_2_naming_the_field(args, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    evaluate_cli.main(CONFIG + args)
  assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_an_output_that_is_a_directory_is_refused_before_evaluating(tmp_path, capsys):
  # Before: the evaluation ran to the end, then an IsADirectoryError traceback lost it.
  with pytest.raises(SystemExit) as exit_info:
    evaluate_cli.main(CONFIG + ["--set", f"run.run_dir={tmp_path / 'run'}",
                                "--output", str(tmp_path)])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2
  assert f"--output '{tmp_path}' is a directory; pass a file path" in err


def test_episodes_below_one_name_the_flag(capsys):
  with pytest.raises(SystemExit) as exit_info:
    evaluate_cli.main(CONFIG + ["--episodes", "0"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "--episodes 0: expected at least 1" in err


def test_a_report_that_cannot_be_written_keeps_its_scores(tmp_path, monkeypatch, capsys):
  # Before: an OSError traceback after the evaluation, and its scores were lost.
  from sao_jax.jobs import evaluate as evaluation

  report = {"step": 3, "tasks": "2 tasks", "samples": 0, "accuracy": 0.5}
  monkeypatch.setattr(evaluation, "evaluate_checkpoint", lambda *args, **kwargs: report)
  (tmp_path / "taken").write_text("x")
  output = tmp_path / "taken" / "report.json"
  with pytest.raises(SystemExit) as exit_info:
    evaluate_cli.main(CONFIG + ["--output", str(output)])
  err = capsys.readouterr().err
  assert exit_info.value.code == 1
  assert f"cannot write the report to '{output}'" in err and '"accuracy": 0.5' in err
