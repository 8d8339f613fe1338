"""Every command checks what a config names (its environment, its variant's functions)
at start-up, before any work: `Config.validate()` cannot, as config sits below the
environments and the learner (`sao_jax.jobs.startup`)."""

import pathlib

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
    "sao-convert lora-to-hf": lambda sets, tmp: convert_cli.main(
        ["lora-to-hf", "--config", DEMO, "--out", str(tmp / "hf"), *sets]),
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
