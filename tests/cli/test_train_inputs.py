"""`sao-train --check` refuses what would fail a run in its first minute, naming the
field and the fix (`startup.check_train_inputs`), and a dataset run's tokenizer is
built offline by `python -m sao_jax.cli.make_tokenizer`."""

import importlib
import pathlib
import sys

import pytest

from sao_jax.chat import load_chat
from sao_jax.cli import make_tokenizer
from sao_jax.cli import train as train_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "configs" / "demo_cpu.py")
VERL = str(ROOT / "examples" / "verl_reward" / "config.py")


@pytest.fixture
def verl_rows(tmp_path):
  """The verl_reward example's Parquet rows, and its reward function importable."""
  sys.path.insert(0, str(ROOT / "examples" / "verl_reward"))
  try:
    yield importlib.import_module("make_data").write(tmp_path / "train.parquet", count=16)
  finally:
    sys.path.remove(str(ROOT / "examples" / "verl_reward"))
    for name in ("make_data", "arith_reward"):
      sys.modules.pop(name, None)


def check(config, *overrides):
  """`sao-train --config config --check --set ...`: its stderr on refusal, else None."""
  args = ["--config", config, "--check"] + [a for o in overrides for a in ("--set", o)]
  try:
    train_cli.main(args)
  except SystemExit as exit_info:
    assert exit_info.code == 2
    return exit_info
  return None


def refusal(capsys, config, *overrides) -> str:
  assert check(config, *overrides) is not None, "--check said the config is valid"
  return capsys.readouterr().err


@pytest.mark.parametrize("field", ["run.init", "run.tokenizer"])
def test_check_refuses_a_path_that_does_not_exist_here(field, tmp_path, capsys):
  missing = tmp_path / "no_such_model"
  err = refusal(capsys, DEMO, f"{field}={missing}", f"run.run_dir={tmp_path / 'run'}")
  assert f"{field}={str(missing)!r} is not a" in err


def test_check_refuses_a_dataset_run_without_a_tokenizer_naming_run_tokenizer(
    verl_rows, tmp_path, capsys):
  err = refusal(capsys, VERL, f"env.dataset.path={verl_rows}", f"run.run_dir={tmp_path / 'run'}")
  assert "run.tokenizer='' but env.task_source='parquet'" in err
  assert "python -m sao_jax.cli.make_tokenizer --config CONFIG --out DIR" in err
  assert "run.sft_steps" not in err  # it is 0 already


def test_check_refuses_sft_on_dataset_rows_naming_run_sft_steps(verl_rows, tmp_path, capsys):
  err = refusal(capsys, VERL, f"env.dataset.path={verl_rows}", "run.sft_steps=4",
                f"run.tokenizer={tmp_path}", f"run.run_dir={tmp_path / 'run'}")
  # The tokenizer path is checked first: make it exist, then sft is what is refused.
  assert "run.tokenizer=" in err
  (tmp_path / "tokenizer.json").write_text("{}")
  err = refusal(capsys, VERL, f"env.dataset.path={verl_rows}", "run.sft_steps=4",
                f"run.tokenizer={tmp_path}", f"run.run_dir={tmp_path / 'run'}")
  assert "run.sft_steps=4 but env.task_source='parquet'" in err and "set run.sft_steps=0" in err


def test_make_tokenizer_builds_what_a_dataset_run_needs(verl_rows, tmp_path, capsys):
  out = tmp_path / "tok"
  make_tokenizer.main(["--config", VERL, "--set", f"env.dataset.path={verl_rows}",
                       "--out", str(out), "--rows", "16"])
  assert f"--set run.tokenizer={out}" in capsys.readouterr().out
  chat = load_chat(out)
  vocab = chat.tokenizer.get_vocab()
  assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= set(vocab) and len(vocab) <= 512
  assert (out / "chat_template.jinja").read_text().startswith("{%")
  ids = chat.tokenizer.encode("What is 3 * 4?").ids
  assert chat.tokenizer.decode(ids) == "What is 3 * 4?"
  # The run it was built for now passes --check.
  assert check(VERL, f"env.dataset.path={verl_rows}", f"run.tokenizer={out}",
               f"run.run_dir={tmp_path / 'run'}") is None
  assert f"{VERL} is valid" in capsys.readouterr().err
