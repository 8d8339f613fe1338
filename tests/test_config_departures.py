"""Every ready config (tests/test_ready_configs.py's, the pod configs and the experiment
settings) says in its docstring, field by field, where it departs from the paper: each
algorithm and learner field whose value differs from the paper variant's
(`AlgorithmConfig.for_variant("sao")`, `LearnerConfig()`) is named under a "Departs from
the paper" heading."""

import dataclasses
import pathlib

import pytest

from sao_jax.config import AlgorithmConfig, LearnerConfig
from sao_jax.config.loading import load_config
from test_ready_configs import CHECKPOINTS, load_module_docstring

CONFIGS = pathlib.Path(__file__).parents[1] / "configs"
READY = sorted([*CHECKPOINTS, "qwen3_8b_v5p32.py", "qwen3_30b_a3b_v5p128.py",
                *(f"experiments/{p.name}" for p in (CONFIGS / "experiments").glob("*.py"))])
HEADING = "Departs from the paper"
# How long a run lasts and how a batch is laid out in memory are not the method.
NOT_THE_METHOD = {"learner.steps", "learner.micro_batches", "learner.batch_tokens",
                  "learner.row_length"}


def departures(cfg) -> list[str]:
  paper = {"algorithm": AlgorithmConfig.for_variant("sao"), "learner": LearnerConfig()}
  return [f"{section}.{field.name}" for section, default in paper.items()
          for field in dataclasses.fields(default)
          if getattr(getattr(cfg, section), field.name) != getattr(default, field.name)
          and f"{section}.{field.name}" not in NOT_THE_METHOD]


@pytest.mark.parametrize("name", READY)
def test_a_ready_config_names_each_field_where_it_departs_from_the_paper(name):
  text = load_module_docstring(CONFIGS / name)
  assert HEADING in text, f"configs/{name}: add a {HEADING!r} section to the docstring"
  section = text[text.index(HEADING):]
  missing = [field for field in departures(load_config(CONFIGS / name))
             if f"`{field}`" not in section]
  assert not missing, f"configs/{name}: name {missing} (and why) under {HEADING!r}"


def test_the_check_sees_a_departure():
  cfg = load_config(CONFIGS / "experiments" / "sanity_long.py")
  assert "learner.policy_lr" in departures(cfg)
  assert "learner.steps" not in departures(cfg)
