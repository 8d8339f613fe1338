"""Every command checks what a config names (its environment, its variant's functions)
at start-up, before any work: `Config.validate()` cannot, as config sits below the
environments and the learner (`sao_jax.jobs.startup`)."""

import pathlib
import re

import pytest

from sao_jax.cli import convert as convert_cli
from sao_jax.cli import evaluate as evaluate_cli
from sao_jax.cli import plan as plan_cli
from sao_jax.cli import sampler as sampler_cli
from sao_jax.cli import train as train_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "configs" / "demo_cpu.py")
# What a config for samplers on other hosts needs, so only the environment is wrong.
REMOTE = ["data.transport=directory", "data.transport_dir=/shared/trajectories",
          "sampler.weights=network", "sampler.weights_secret_env=SAO_SECRET",
          "sampler.weights_addresses=host:1"]


def _sets(overrides):
  return [a for o in overrides for a in ("--set", o)]


COMMANDS = {
    "sao-train --check": lambda sets, tmp: train_cli.main(["--config", DEMO, "--check", *sets]),
    "sao-eval": lambda sets, tmp: evaluate_cli.main(["--config", DEMO, *sets]),
    "sao-sampler": lambda sets, tmp: sampler_cli.main(["--config", DEMO, *_sets(REMOTE), *sets]),
    "sao-plan": lambda sets, tmp: plan_cli.main(["--config", DEMO, "--topology", "v5e:2x2",
                                                 *sets]),
    "sao-convert run-to-hf": lambda sets, tmp: convert_cli.main(
        ["run-to-hf", "--config", DEMO, "--out", str(tmp / "hf"), *sets]),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("override, message", [
    ("env.name=chess", "env.name='chess' is invalid: known environments are"),
    ("env.options.wrod=1", "env.options.wrod is not an option of environment 'math_tool'"),
])
def test_every_command_refuses_a_bad_environment_before_any_work(command, override, message,
                                                                 tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    COMMANDS[command](["--set", override], tmp_path)
  assert exit_info.value.code not in (0, None)
  assert message in str(exit_info.value.code) + capsys.readouterr().err
  assert not (tmp_path / "hf").exists()


# The demo's mesh (fsdp=-1) over the 8 emulated devices has 8 page shards (data x fsdp).
SPLIT_REFUSAL = (r"a paged cache of {count} slots does not split over the {shards} page shards "
                 r"of mesh axes \('fsdp',\): set sampler.slots and sampler.kv_pages to multiples "
                 r"of {shards}")


def test_a_pool_the_eval_mesh_cannot_split_is_refused_by_the_startup_check():
  from sao_jax.config import load_config
  from sao_jax.jobs import evaluate, startup

  cfg = load_config(DEMO, ["sampler.slots=4"])
  with pytest.raises(ValueError, match=SPLIT_REFUSAL.format(count=4, shards=8)):
    startup.check(cfg, evaluate.eval_meshes)
  startup.check(cfg)  # sao-train's samplers run the demo unsharded: one device, one shard
  startup.check(load_config(DEMO, ["sampler.slots=8"]), evaluate.eval_meshes)
  startup.check(load_config(DEMO, ["sampler.slots=4", "sampler.kv_layout=dense"]),
                evaluate.eval_meshes)  # no pages to split


def test_sao_eval_refuses_a_pool_its_mesh_cannot_split_before_restoring_anything(
    monkeypatch, tmp_path, capsys):
  from sao_jax.jobs import evaluate

  restored = []
  monkeypatch.setattr(evaluate, "restore_policy", lambda *a, **k: restored.append(a))
  monkeypatch.setattr(evaluate, "load_chat", lambda *a, **k: restored.append(a))
  with pytest.raises(SystemExit) as exit_info:
    evaluate_cli.main(["--config", DEMO, "--set", "sampler.slots=4",
                       "--set", f"run.run_dir={tmp_path / 'run'}"])
  assert exit_info.value.code == 2
  assert re.search(SPLIT_REFUSAL.format(count=4, shards=8), capsys.readouterr().err)
  assert restored == []


def test_sao_train_check_refuses_a_sampler_share_that_cannot_split_its_pool(capsys):
  """run.device_split=(6, 2) gives the one sharded sampler 2 devices: fsdp=-1 makes 2
  page shards, known from the config alone (no backend started: the chips are not
  claimed yet), and 3 slots do not split over them."""
  sets = ["run.device_split=[6,2]", "run.num_samplers=1", "sampler.slots=3"]
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", DEMO, "--check", *_sets(sets + ["sampler.sharded=true"])])
  assert re.search(SPLIT_REFUSAL.format(count=3, shards=2), str(exit_info.value.code)
                   + capsys.readouterr().err)
  train_cli.main(["--config", DEMO, "--check", *_sets(sets)])  # unsharded: one device each


def test_sao_train_check_refuses_a_sampler_mesh_larger_than_its_process_devices(capsys):
  """A sampler mesh of data 2 x tensor 4 (what sao-plan compiles for a two-host
  v5p:2x2x2 sampler slice) given to a local sampler with 2 devices: refused before
  anything starts, naming that a sampler spanning hosts is not built and the fix. The
  old check stopped at mesh.shape's "axis sizes ... use 8 devices but 2 are available"
  for a paged cache, and not at all for a dense one."""
  for layout in ("paged", "dense"):
    sets = ["run.device_split=[6,2]", "run.num_samplers=1", "sampler.sharded=true",
            "sampler.mesh=data=2,tensor=4", f"sampler.kv_layout={layout}"]
    with pytest.raises(SystemExit) as exit_info:
      train_cli.main(["--config", DEMO, "--check", *_sets(sets)])
    message = str(exit_info.value.code) + capsys.readouterr().err
    assert "sampler.mesh={'data': 2, 'sequence': 1, 'tensor': 4, 'expert': 1}: a sampler process " \
        "lays its engine over its own devices, 2 here" in message, message
    assert "A sampler spanning hosts is not built" in message


def test_sao_sampler_refuses_a_fixed_sampler_mesh_that_cannot_split_its_pool(monkeypatch,
                                                                             capsys):
  from sao_jax.sampler import remote

  started = []
  monkeypatch.setattr(remote, "run", lambda *a, **k: started.append(a))
  with pytest.raises(SystemExit) as exit_info:
    sampler_cli.main(["--config", DEMO, *_sets(REMOTE), *_sets(
        ["sampler.sharded=true", "sampler.mesh=fsdp=4,tensor=-1", "sampler.slots=6"])])
  assert exit_info.value.code == 2
  message = capsys.readouterr().err
  assert "a paged cache of 6 slots does not split over the 4 page shards of mesh axes ('fsdp',)" \
      in message
  assert started == []


@pytest.mark.parametrize("flags, sets, message", [
    (["--coordinator", "10.0.0.2:8477"], [],
     "needs --coordinator, --num-processes and --process-id together; missing "
     "--num-processes, --process-id"),
    (["--coordinator", "10.0.0.2", "--num-processes", "2", "--process-id", "0"], [],
     "--coordinator='10.0.0.2' is not HOST:PORT"),
    (["--coordinator", "10.0.0.2:8477", "--num-processes", "2", "--process-id", "2"], [],
     r"--process-id=2 is not in \[0, --num-processes=2\)"),
    (["--coordinator", "10.0.0.2:8477", "--num-processes", "2", "--process-id", "1"], [],
     "sampler.sharded=False runs it on one device; set sampler.sharded=true"),
    (["--coordinator", "10.0.0.2:8477", "--num-processes", "2", "--process-id", "1",
      "--workers", "2"], ["sampler.sharded=true"], "--workers=2 with --coordinator"),
])
def test_sao_sampler_refuses_an_engine_group_it_cannot_form(capsys, flags, sets, message):
  """One engine over several hosts (`--coordinator`): the flags and the config are
  checked before anything waits for the learner or joins the group."""
  with pytest.raises(SystemExit) as exit_info:
    sampler_cli.main(["--config", DEMO, *_sets(REMOTE), *_sets(sets), *flags])
  assert exit_info.value.code == 2
  assert re.search(message, capsys.readouterr().err)
