"""`sao-train` turns bad input into one clear line and exit status 2, before any work."""

import pathlib

import pytest

from sao_jax.cli import train as train_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "configs" / "demo_cpu.py")


@pytest.mark.parametrize("override,message", [
    ("algorithm.variant=reinforce", "algorithm.variant='reinforce'"),
    ("env.name=chess", "env.name='chess'"),
    ("env.task_source=jsonl", "env.jsonl_path=''"),
    ("learner.batch_trajectories=0", "learner.batch_trajectories=0"),
    ("learner.stepz=3", "LearnerConfig has no field 'stepz'"),
    ("learner.policy_lr=1e999", "learner.policy_lr=inf is invalid: expected a finite number"),
])
def test_bad_config_values_are_named(override, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", DEMO, "--set", override])
  assert exit_info.value.code == 2
  assert message in capsys.readouterr().err


def test_missing_config_file_is_named(capsys):
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", "configs/nope.py"])
  assert exit_info.value.code == 2 and "nope.py" in capsys.readouterr().err


def test_plot_of_a_directory_without_metrics_is_named(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--plot", str(tmp_path)])
  assert exit_info.value.code == 2 and "metrics.jsonl" in capsys.readouterr().err


def test_jsonl_with_a_bad_row_names_its_line(tmp_path, capsys):
  tasks = tmp_path / "tasks.jsonl"
  tasks.write_text('{"prompt": "Compute 1 + 1.", "answer": "2"}\n{"prompt": "no answer"}\n')
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", DEMO, "--set", "env.task_source=jsonl",
                    "--set", f"env.jsonl_path={tasks}", "--set", f"run.run_dir={tmp_path / 'run'}"])
  assert exit_info.value.code == 2
  assert f"{tasks}:2" in capsys.readouterr().err


def test_existing_checkpoints_are_looked_up_in_the_bucket(monkeypatch, capsys):
  from sao_jax.jobs import train

  class Bucket:  # what storage_path returns for gs:// (an epath.Path), without the network
    def __init__(self, url):
      self.url = str(url)

    def is_dir(self):
      return True

    def iterdir(self):
      return iter([self.url + "/10"])

    def __str__(self):
      return self.url

  monkeypatch.setattr(train, "storage_path", Bucket)
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", DEMO, "--set", "checkpoint.directory=gs://bucket/run/ckpt"])
  assert exit_info.value.code == 2
  assert "gs://bucket/run/ckpt already holds checkpoints" in capsys.readouterr().err


def test_a_learner_whose_tools_cannot_be_isolated_refuses_before_any_work(tmp_path, monkeypatch,
                                                                          capsys):
  from sao_jax.envs.sandbox import bwrap

  # What the sandbox's self-test says on a machine without bubblewrap.
  monkeypatch.setattr(bwrap, "unavailable_reason", lambda: "bwrap not found on PATH; install it")
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", DEMO, "--set", f"run.run_dir={tmp_path / 'run'}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert "env.sandbox='bwrap'" in err and "bwrap not found on PATH" in err
  assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("below", ["", "sub"])
def test_a_run_dir_that_cannot_be_a_directory_is_named(tmp_path, capsys, below):
  # Before: a FileExistsError / NotADirectoryError traceback from mkdir.
  taken = tmp_path / "notes.txt"
  taken.write_text("not a run directory\n")
  run_dir = taken / below if below else taken
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", DEMO, "--set", f"run.run_dir={run_dir}"])
  assert exit_info.value.code == 2
  assert f"run.run_dir='{run_dir}' cannot be created as a directory" in capsys.readouterr().err
  assert taken.read_text() == "not a run directory\n"


def test_a_config_file_with_a_syntax_error_is_one_line(tmp_path, capsys):
  (tmp_path / "mine.py").write_text("def get_config(:\n")
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", str(tmp_path / "mine.py")])
  assert exit_info.value.code == 2 and "mine.py' line 1: SyntaxError" in capsys.readouterr().err


def test_a_tokenizer_file_that_does_not_parse_is_named(tmp_path, capsys):
  # Before: tokenizers' bare `Exception: expected value at line 1 column 1` traceback.
  (tmp_path / "tokenizer.json").write_text("not json\n")
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", DEMO, "--set", f"run.tokenizer={tmp_path}",
                    "--set", f"run.run_dir={tmp_path / 'run'}"])
  assert exit_info.value.code == 2
  assert "tokenizer.json' is not a tokenizer.json the tokenizers library reads" in (
      capsys.readouterr().err)


def test_resume_without_a_checkpoint_says_it_starts_over(tmp_path, monkeypatch, capsys):
  # Before: a typo'd run.run_dir with --resume silently trained a new run from step 0.
  from sao_jax.jobs import train

  started = []
  monkeypatch.setattr(train, "run", lambda cfg, resume, log, profile=None: started.append(
      (cfg.run.resume, train.resume_decision(cfg, log))) or {
          "steps_done": 0, "stopped_by": "steps", "plot": ""})
  for flag, mode in ((["--resume"], "always"), (["--resume", "auto"], "auto")):
    train_cli.main(["--config", DEMO, "--set", f"run.run_dir={tmp_path / 'typo'}", *flag])
    assert started.pop() == (mode, False)
    assert (f"run.resume={mode!r} found no checkpoint in {tmp_path / 'typo' / 'checkpoints'}; "
            "starting from step 0") in capsys.readouterr().out
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", DEMO, "--resume", "sometimes"])
  assert exit_info.value.code == 2 and "'auto'" in capsys.readouterr().err
