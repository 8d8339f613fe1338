"""Flag conventions of every sao-* command (issue #37): hyphenated flags with help text,
old underscore spellings as hidden aliases, and `sao-train --check`."""

import argparse
import json
import pathlib
import subprocess
import sys

import pytest

from sao_jax.cli import convert, evaluate, plan, sampler, train

ROOT = pathlib.Path(__file__).resolve().parents[2]
PARSERS = {"sao-train": train.build_parser, "sao-eval": evaluate.build_parser,
           "sao-sampler": sampler.build_parser, "sao-convert": convert.build_parser,
           "sao-plan": plan.build_parser}


def _parsers(parser: argparse.ArgumentParser, name: str):
  """(name, parser) for `parser` and each of its subcommands."""
  yield name, parser
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
      for sub_name, sub in action.choices.items():
        yield from _parsers(sub, f"{name} {sub_name}")


def _options():
  for command, build in PARSERS.items():
    for name, parser in _parsers(build(), command):
      for action in parser._actions:  # pylint: disable=protected-access
        if action.option_strings:
          yield name, action


def test_every_flag_is_hyphenated():
  underscored = [(name, opt) for name, action in _options() for opt in action.option_strings
                 if "_" in opt]
  assert not underscored, f"spell these with hyphens (keep the old one as an alias): {underscored}"


def test_every_flag_has_help_text():
  bare = [(name, action.option_strings) for name, action in _options()
          if not action.help or action.help == argparse.SUPPRESS]
  assert not bare, f"these flags have no help text: {bare}"


@pytest.mark.parametrize("old, new", sorted(convert.ALIASES.items()))
def test_old_convert_spellings_are_hidden_aliases(old, new):
  argv = {"--hf_dir": ["hf-to-sao", old, "x", "--out", "y"],
          "--tokenizer_dir": ["sao-to-hf", "--params", "p", "--out", "y", old, "t"],
          "--max_shard_mb": ["sao-to-hf", "--params", "p", "--out", "y", f"{old}=7"],
          "--peft_out": ["lora-to-hf", "--config", "c.py", "--out", "y", old, "a"]}[old]
  parser = convert.build_parser()
  with_old = convert.flags.parse(parser, argv, convert.ALIASES)
  with_new = parser.parse_args([new + arg[len(old):] if arg.startswith(old) else arg
                                for arg in argv])
  assert with_old == with_new
  subcommand = next(sub for name, sub in _parsers(parser, "") if name == " " + argv[0])
  assert old not in subcommand.format_help()  # hidden
  assert new in subcommand.format_help()


def test_an_unknown_underscore_flag_is_still_refused(capsys):
  with pytest.raises(SystemExit):
    convert.flags.parse(convert.build_parser(), ["hf-to-sao", "--hf-dir", "x", "--out", "y",
                                                 "--hf_dirx", "z"],
                        convert.ALIASES)
  assert "unrecognized arguments: --hf_dirx" in capsys.readouterr().err


def test_check_prints_the_resolved_config_and_starts_nothing():
  """`sao-train --check` in a fresh interpreter: the resolved config (with the --set
  values and derived run paths) on stdout, and neither the training job nor a run
  directory touched."""
  code = ("import sys; from sao_jax.cli import train; "
          "train.main(sys.argv[1:]); "
          "assert 'sao_jax.jobs.train' not in sys.modules, 'imported the training job'")
  result = subprocess.run(
      [sys.executable, "-c", code, "--config", "configs/demo_cpu.py", "--check",
       "--set", "run.loggers=tensorboard,wandb", "--set", "run.run_dir=runs/never_made",
       "--set", "learner.steps=7"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr
  resolved = json.loads(result.stdout)
  assert resolved["run"]["loggers"] == ["tensorboard", "wandb"]
  assert resolved["learner"]["steps"] == 7
  assert resolved["checkpoint"]["directory"].startswith("runs/never_made")
  assert "configs/demo_cpu.py is valid" in result.stderr
  assert not (ROOT / "runs" / "never_made").exists()


def test_check_reports_a_bad_override_and_exits_2(capsys):
  with pytest.raises(SystemExit) as exit_info:
    train.main(["--config", str(ROOT / "configs/demo_cpu.py"), "--check",
                "--set", "learner.steps=-1"])
  assert exit_info.value.code == 2
  assert "learner.steps=-1 is invalid" in capsys.readouterr().err
