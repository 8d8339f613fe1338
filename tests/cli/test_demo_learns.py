"""The CPU demo's learning claim (slow: the full `make demo` run, ~10 min on 2 cores).

Thresholds: a randomly initialised model solves ~0 held-out tasks (it cannot
produce a correct \\boxed{} answer by chance); in our runs the SFT warm-start
brought greedy held-out accuracy to ~0.86 and SAO to 0.92-1.0 on the 64
held-out tasks (standard error ~0.04). We require the final accuracy to be at
least 0.6 and 0.5 above the starting point: far above chance, with room for
machine and seed variance, and failing if either SFT or the RL phase breaks
the policy.
"""

import json
import pathlib

import pytest

from sao_jax import train
from sao_jax.config import load_config

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_learns(tmp_path):
  cfg = load_config(ROOT / "configs" / "demo_cpu.py", [f"run.run_dir={tmp_path}"])
  summary = train.run(cfg)
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
  start, final = evals[0], evals[-1]
  assert start[0] == -cfg.run.sft_steps and final[0] == cfg.learner.steps
  assert start[1] <= 0.1, evals
  assert final[1] >= 0.6 and final[1] >= start[1] + 0.5, evals
  assert summary["steps_done"] == cfg.learner.steps
