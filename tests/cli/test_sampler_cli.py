"""`sao-sampler` refuses configs whose learner it could not reach, before any work."""

import pathlib

import pytest

from sao_jax.cli import sampler as sampler_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "configs" / "demo_cpu.py")
REMOTE = ["data.transport=directory", "data.transport_dir=/shared/trajectories"]


@pytest.mark.parametrize("overrides,message", [
    ([], "data.transport='queue'"),
    (REMOTE, "sampler.weights='shared_memory'"),
    (REMOTE + ["sampler.weights=network"], "sampler.weights_secret_file='' is invalid"),
    (REMOTE + ["sampler.weights=network", "sampler.weights_secret_env=SAO_SECRET"],
     "sampler.weights_addresses=() is invalid"),
    (["learner.stepz=3"], "LearnerConfig has no field 'stepz'"),
])
def test_unreachable_learner_settings_are_named(overrides, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    sampler_cli.main(["--config", DEMO] + [a for o in overrides for a in ("--set", o)])
  assert exit_info.value.code == 2
  assert message in capsys.readouterr().err


def test_bad_worker_counts_are_named(capsys):
  with pytest.raises(SystemExit) as exit_info:
    sampler_cli.main(["--config", DEMO, "--workers", "0"])
  assert exit_info.value.code == 2 and "--workers=0" in capsys.readouterr().err


def test_worker_ids_past_the_group_id_space_are_named(capsys):
  with pytest.raises(SystemExit) as exit_info:
    sampler_cli.main(["--config", DEMO, "--workers", "8", "--first-worker", "1020"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "worker ids up to 1027" in err and "at most 1024" in err
