"""Every ready config (tests/test_ready_configs.py's, the pod configs and the experiment
settings) says in its docstring, field by field, where it departs from the paper: each
algorithm and learner field whose value differs from the paper variant's
(`AlgorithmConfig.for_variant("sao")`, `LearnerConfig()`) is named under a "Departs from
the paper" heading. The ready model configs run the paper's critic schedule (issue #50
item 1) or name where they do not."""

import dataclasses
import pathlib

import pytest

from sao_jax.config import AlgorithmConfig, LearnerConfig
from sao_jax.config.learner import READY_VALUE_PRETRAIN_STEPS
from sao_jax.config.loading import load_config
from test_ready_configs import CHECKPOINTS, load_module_docstring

CONFIGS = pathlib.Path(__file__).parents[1] / "configs"
READY = sorted([*CHECKPOINTS, "qwen3_8b_v5p32.py", "qwen3_30b_a3b_v5p128.py",
                *(f"experiments/{p.name}" for p in (CONFIGS / "experiments").glob("*.py"))])
HEADING = "Departs from the paper"
# How long a run lasts and how a batch is laid out in memory are not the method.
NOT_THE_METHOD = {"learner.steps", "learner.micro_batches", "learner.batch_tokens",
                  "learner.row_length"}
# The paper pretrains the critic for a number of steps it does not give, so no count
# departs from it by being a count; LearnerConfig's 0 (no pretraining) is no paper value
# either. The ready model configs' count is checked against the paper schedule below.
NO_PAPER_NUMBER = {"learner.value_pretrain_steps"}
# The ready configs for real models: the paper's critic schedule is theirs to carry.
MODEL_CONFIGS = sorted([*CHECKPOINTS, "qwen3_8b_v5p32.py", "qwen3_30b_a3b_v5p128.py",
                        "from_hf.py"])
# The paper's critic schedule (docs/algorithm.md §4) as learner fields: the critic at 5x
# the policy's lr (value_lr None), value pretraining (our count: the paper gives none),
# the paper's 10 warm-up steps. The lr warm-up ramps the policy only whatever the config
# (sao_jax.learner.state.value_optimizer; tests/learner/test_train_step.py checks it).
PAPER_CRITIC_SCHEDULE = {"value_lr": None, "value_pretrain_steps": READY_VALUE_PRETRAIN_STEPS,
                         "critic_warmup_steps": 10}


def departures(cfg) -> list[str]:
  paper = {"algorithm": AlgorithmConfig.for_variant("sao"), "learner": LearnerConfig()}
  return [f"{section}.{field.name}" for section, default in paper.items()
          for field in dataclasses.fields(default)
          if getattr(getattr(cfg, section), field.name) != getattr(default, field.name)
          and f"{section}.{field.name}" not in NOT_THE_METHOD | NO_PAPER_NUMBER]


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


def departure_section(name: str) -> str:
  text = load_module_docstring(CONFIGS / name)
  return text[text.index(HEADING):] if HEADING in text else ""


@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_a_ready_model_config_runs_the_papers_critic_schedule_or_names_its_departure(name):
  learner = load_config(CONFIGS / name).learner
  section = departure_section(name)
  differs = {field: getattr(learner, field) for field, paper in PAPER_CRITIC_SCHEDULE.items()
             if getattr(learner, field) != paper and f"`learner.{field}`" not in section}
  assert not differs, (f"configs/{name}: {differs} is not the paper's critic schedule "
                       f"{PAPER_CRITIC_SCHEDULE}; set it, or name it under {HEADING!r}")


def test_the_paper_critic_schedule_holds_the_papers_values():
  """The warm-up and the lr ratio are the paper's own numbers, which LearnerConfig's
  defaults already hold; only the pretraining count is ours."""
  default = LearnerConfig()
  assert default.critic_warmup_steps == PAPER_CRITIC_SCHEDULE["critic_warmup_steps"] == 10
  assert default.value_lr is None and default.critic_lr == pytest.approx(5 * default.policy_lr)
  assert READY_VALUE_PRETRAIN_STEPS > 0
