"""verl's reward functions, unmodified, as `env.reward_fn`: called as verl calls them
(by keyword, `data_source`, `solution_str`, `ground_truth`, `extra_info`), their results
read as verl reads them, through the real `EpisodeRunner` on verl-shaped Parquet rows.
`verl_reward_score` (tests/fixtures) has the shape of verl's `reward_score` package."""

import pathlib
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sao_jax.chat import chat_format
from sao_jax.config import EnvConfig
from sao_jax.config.dataset import DatasetConfig
from sao_jax.envs import registry, rewards
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.sampler.episodes import EpisodeRunner, run_to_completion
from sao_jax.sampler.scripted import ScriptedEngine

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
TOKENIZER = train_tokenizer(["What is 2 + 2? #### 4"] * 4, vocab_size=300)
CHAT = chat_format(None, TOKENIZER)


@pytest.fixture
def verl_rows(tmp_path, monkeypatch):
  """A verl-shaped Parquet file (verl's data_preprocess/gsm8k.py layout), answers 0..5,
  and the fixture package `verl_reward_score` importable."""
  monkeypatch.syspath_prepend(str(FIXTURES))
  n = 6
  path = tmp_path / "train.parquet"
  pq.write_table(pa.table({
      "data_source": ["openai/gsm8k" if i < 4 else "math_dapo" for i in range(n)],
      "prompt": [[{"role": "user", "content": f"What is {i} + 0?"}] for i in range(n)],
      "ability": ["math"] * n,
      "reward_model": [{"style": "rule", "ground_truth": str(i)} for i in range(n)],
      "extra_info": [{"split": "train", "index": i} for i in range(n)],
  }), path)
  yield path
  for name in [m for m in sys.modules if m.startswith("verl_reward_score")]:
    del sys.modules[name]


def run(config: EnvConfig, reply: str):
  """Every row's episode through the real runner, each replying `reply`, by row."""
  runner = EpisodeRunner(ScriptedEngine(CHAT, lambda episode, turn: reply), CHAT,
                         lambda: registry.make_env(config), max_episodes=2,
                         step_timeout_s=config.step_timeout_s, log=lambda line: None,
                         env_name=registry.describe(config))
  tasks = registry.make_tasks(config)
  count = 6
  done = run_to_completion(runner, tasks, count, num_slots=4, seed=0)
  return {traj.info["task"]: traj for traj in done}, runner


def config(path, reward_fn, **changes):
  return EnvConfig(name="single_turn", task_source="parquet", reward_fn=reward_fn,
                   dataset=DatasetConfig.verl(str(path)), **changes)


def test_verls_gsm8k_scorer_grades_episodes_unmodified(verl_rows):
  # Called as reward(response, task, messages), every episode failed inside it.
  done, runner = run(config(verl_rows, "verl_reward_score.gsm8k:compute_score"),
                     "2 + 1 is 3, so #### 3")
  assert not runner.failures
  outcomes = {task: traj.outcome for task, traj in done.items()}
  assert outcomes == {f"train:{i}": float(i == 3) for i in range(6)}
  assert {traj.info["end"] for traj in done.values()} == {"reward_fn"}


def test_strict_gsm8k_gives_nothing_without_the_marker(verl_rows):
  done, runner = run(config(verl_rows, "verl_reward_score.gsm8k:compute_score"), "it is 3")
  assert not runner.failures and {traj.outcome for traj in done.values()} == {0.0}


def test_verls_default_compute_score_dispatches_on_the_data_source(verl_rows):
  done, runner = run(config(verl_rows, "verl_reward_score:default_compute_score"), "#### 4")
  assert not runner.failures
  assert [done[f"train:{i}"].outcome for i in range(4)] == [0.0, 0.0, 0.0, 0.0]
  # math_dapo's dict: "score" the reward; the bool "acc" and the int "index" are metrics,
  # the text "pred" is not one (verl keeps it out of its metrics too).
  assert done["train:4"].outcome == 1.0 and done["train:5"].outcome == -1.0
  metrics = [done[f"train:{i}"].info["metrics"] for i in (4, 5)]
  assert [{k: m[k] for k in m if k != "env_reward"} for m in metrics] == [
      {"acc": 1.0, "index": 4.0}, {"acc": 0.0, "index": 5.0}]


def test_a_verl_function_that_raises_fails_its_episode(verl_rows, tmp_path):
  rows = pq.read_table(verl_rows).to_pydict()
  rows["data_source"] = ["unknown/source"] * 6
  pq.write_table(pa.table(rows), verl_rows)
  done, runner = run(config(verl_rows, "verl_reward_score:default_compute_score"), "#### 1")
  # Dropped and counted as environment failures, never trained as reward 0.
  assert all(traj.info["end"] == "env_failure" and traj.env_failure.startswith(
      "reward function verl_reward_score:default_compute_score raised NotImplementedError: "
      "Reward function is not implemented for data_source='unknown/source'")
      for traj in done.values()), [traj.env_failure for traj in done.values()]


def test_the_convention_can_be_named(verl_rows):
  # "sao" forces sao_jax's convention: verl's function then gets the wrong arguments.
  done, _ = run(config(verl_rows, "verl_reward_score.gsm8k:compute_score",
                       reward_fn_convention="sao"), "#### 3")
  assert all("compute_score raised AssertionError" in traj.env_failure
             for traj in done.values()), [traj.env_failure for traj in done.values()]
  with pytest.raises(ValueError, match=r"env.reward_fn_convention='openai' is invalid: "
                                       r"allowed values are 'auto', 'sao', 'verl'"):
    registry.check(config(verl_rows, "", reward_fn_convention="openai"))


@pytest.mark.parametrize("value, read", [
    (True, 1.0), (0, 0.0), (0.5, 0.5), ((0.25, {"detail": "x"}), 0.25), ([False], 0.0),
    ({"score": 1, "acc": True, "pred": "7"}, {"score": 1, "acc": 1.0}),
    ({"score": "bad"}, {"score": "bad"}),  # passed on: the contract refuses it by name
])
def test_verl_results_are_read_as_verls_default_compute_score_reads_them(value, read):
  assert rewards.verl_result(value) == read
