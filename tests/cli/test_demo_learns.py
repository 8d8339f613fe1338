"""The CPU demo's learning claim for the RL phase (slow: the full `make demo` run).

The warm-start stops once validation accuracy reaches `run.sft_target_accuracy`
(0.4), so RL starts well below the ceiling, and the claim is about RL's own gain:
held-out accuracy (greedy, 256 tasks, standard error ~0.03 per evaluation) from
RL step 0 to the final step, as the summary reports it (`train.rl_gain`), not
the gain from random init that SFT alone carries.
"""

import json
import pathlib

import pytest

from sao_jax import train
from sao_jax.config import load_config

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "no RL setting tried so far gains on the demo (README, demo walk-through: 13 runs, SAO, "
    "GRPO and the running mean, lr 1e-4..1e-3, 16 or 64 episodes a step, temperature 0.5 and "
    "1): held-out 0.566 -> 0.582 at the demo's policy_lr 2e-5, and falls at larger steps; the "
    "warm-start's greedy accuracy rests on near-tie tokens (sampled reward ~0.25 against "
    "greedy ~0.5-0.77)"))
def test_demo_rl_phase_gains(tmp_path):
  cfg = load_config(ROOT / "configs" / "demo_cpu.py", [f"run.run_dir={tmp_path}"])
  summary = train.run(cfg)
  assert summary["steps_done"] == cfg.learner.steps
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r and r["step"] >= 0]
  assert evals[0][0] == 0 and evals[-1][0] == cfg.learner.steps
  assert summary["eval/accuracy_after_sft"] == evals[0][1]
  assert summary["eval/accuracy_after_rl"] == evals[-1][1]
  # Below the ceiling at the start (the warm-start stopped early) ...
  assert summary["eval/accuracy_after_sft"] <= 0.7, evals
  # ... and RL's own gain: > 3 standard errors of the difference of two 256-episode
  # evaluations (sqrt(2) * 0.03).
  assert summary["eval/rl_gain"] >= 0.15, evals


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
