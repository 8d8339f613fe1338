"""The CPU demo's learning claim for the RL phase (slow: the full `make demo` run).

Half the demonstrations guess the question's first number without the tool
(`env.demo_guess_rate`), so the SFT warm-start imitates a habit that fails, and
RL starts below the ceiling whatever SFT's length. The claim is about RL's own
gain: held-out accuracy (greedy, 256 tasks, standard error <= 0.03 per
evaluation) from RL step 0 to the final step, as the summary reports it
(`train.rl_gain`), not the gain from random init that SFT carries.
"""

import json
import pathlib

import pytest

from sao_jax.config import load_config
from sao_jax.jobs import train

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_rl_phase_gains(tmp_path):
  cfg = load_config(ROOT / "configs" / "demo_cpu.py", [f"run.run_dir={tmp_path}"])
  summary = train.run(cfg)
  assert summary["steps_done"] == cfg.learner.steps
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r and r["step"] >= 0]
  assert evals[0][0] == 0 and evals[-1][0] == cfg.learner.steps
  assert summary["eval/accuracy_after_sft"] == evals[0][1]
  assert summary["eval/accuracy_after_rl"] == evals[-1][1]
  # Below the ceiling at the start (the warm-start imitates the guesses) ...
  assert summary["eval/accuracy_after_sft"] <= 0.7, evals
  # ... and RL's own gain (measured: 0.000 -> 1.000) is far beyond the noise of two
  # 256-episode evaluations (standard error of the difference <= sqrt(2) * 0.03) ...
  assert summary["eval/rl_gain"] >= 0.5, evals
  # ... and shows in the sampled (temperature 1) training reward too (measured: 10-step
  # means 0.39 -> 0.79), not only in greedy decoding.
  rewards = [r["reward/mean"] for r in rows if "reward/mean" in r and r["step"] >= 1]
  assert sum(rewards[-10:]) / 10 >= sum(rewards[:10]) / 10 + 0.2, rewards


def test_rl_gain_is_measured_from_rl_step_zero(tmp_path):
  """train.rl_gain: the warm-start's evaluations (negative steps) are not RL's."""
  evals = [(-300, 0.0), (0, 0.41), (20, 0.5), (60, 0.62)]
  (tmp_path / "metrics.jsonl").write_text("".join(
      json.dumps({"step": s, "eval/accuracy": a}) + "\n" for s, a in evals)
      + json.dumps({"step": 61, "reward/mean": 0.5}) + "\n")
  assert train.rl_gain(tmp_path) == pytest.approx(
      {"eval/accuracy_after_sft": 0.41, "eval/accuracy_after_rl": 0.62, "eval/rl_gain": 0.21})
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 5, "eval/accuracy": 0.3}) + "\n")
  assert train.rl_gain(tmp_path) == {}  # no evaluation at RL step 0 (e.g. eval_every=0)


def test_rl_gain_reports_the_sampled_accuracy_beside_the_greedy_one(tmp_path):
  """The honest RL gain: greedy accuracy can flip 0 -> 1 on one opening token, the sampled
  (training-temperature) accuracy moves with the probabilities; both are in the summary."""
  rows = [{"step": 0, "eval/accuracy": 0.0, "eval/sampled_accuracy": 0.39},
          {"step": 60, "eval/accuracy": 1.0, "eval/sampled_accuracy": 0.79}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  gain = train.rl_gain(tmp_path)
  assert gain == pytest.approx({
      "eval/accuracy_after_sft": 0.0, "eval/accuracy_after_rl": 1.0, "eval/rl_gain": 1.0,
      "eval/sampled_accuracy_after_sft": 0.39, "eval/sampled_accuracy_after_rl": 0.79,
      "eval/sampled_rl_gain": 0.40})
  assert train.rl_gain_line(gain, 256, 1.0, sft_steps=400) == (
      "held-out accuracy (256 episodes): greedy after SFT 0.000, after RL 1.000, RL gain "
      "+1.000; sampled (temperature 1) after SFT 0.390, after RL 0.790, RL gain +0.400")
  # A run without a warm-start (a dataset run, sft_steps=0) had no SFT to be "after".
  assert train.rl_gain_line(gain, 256, 1.0, sft_steps=0) == (
      "held-out accuracy (256 episodes): greedy before RL 0.000, after RL 1.000, RL gain "
      "+1.000; sampled (temperature 1) before RL 0.390, after RL 0.790, RL gain +0.400")
  from sao_jax.run import metrics
  assert metrics.plot_curves(tmp_path).stat().st_size > 0  # greedy and sampled, one panel
