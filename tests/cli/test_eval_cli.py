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
])
def test_bad_evaluation_settings_exit_2_naming_the_field(args, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    evaluate_cli.main(CONFIG + args)
  assert exit_info.value.code == 2 and message in capsys.readouterr().err
