"""Writes fake experiment outputs (what the runner and sao-train leave) for report tests."""

import json
import pathlib

import numpy as np

BATCH = 16


def write_run(out: pathlib.Path, setting: str, variant: str, seed: int, rewards, *,
              accuracies=None, eval_every: int = 0, padding=None, extra=None,
              duplicate_last: bool = False) -> str:
  """A run directory with metrics.jsonl (sao_jax.run.metrics format), config.json and
  experiment.json; returns its path relative to `out`. `padding[step]` batch rows
  hold no trajectory; the others are split between lag 0 and lag 1."""
  rel = f"runs/{setting}/{variant}-seed{seed}"
  run_dir = out / rel
  run_dir.mkdir(parents=True)
  padding = np.zeros(len(rewards)) if padding is None else np.asarray(padding)
  rows = []
  for step, reward in enumerate(rewards):
    real = BATCH - padding[step]
    row = {"step": step, "time": 1000.0 + step, "reward/mean": reward,
           "batch/padding_rows": float(padding[step]), "staleness/lag_0": float(real // 2),
           "staleness/lag_1": float(real - real // 2), "nonfinite_skips": 0.0,
           "dropped/stale": float(step // 10)}
    row.update({k: float(v[step]) for k, v in (extra or {}).items()})
    rows.append(row)
  if duplicate_last:  # a resumed run redoes the steps after its last checkpoint
    rows.append({**rows[-1], "reward/mean": -5.0})
    rows.append({**rows[-1], "reward/mean": rewards[-1]})
  for i, accuracy in enumerate(accuracies or []):
    rows.append({"step": i * eval_every, "time": 2000.0 + i, "eval/accuracy": accuracy})
  rows.insert(0, {"step": -3, "time": 900.0, "sft/loss": 1.0})
  (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (run_dir / "config.json").write_text(json.dumps(
      {"learner": {"batch_trajectories": BATCH, "policy_lr": 1e-4, "value_lr": None},
       "run": {"init": f"warm/seed{seed}/policy", "eval_episodes": 64}}))
  (run_dir / "experiment.json").write_text(json.dumps(
      {"variant": variant, "seed": seed, "overrides": [], "done": True,
       "invocations": [{"end_step": len(rewards), "exit_code": 0, "wall_s": 60.0 + seed}]}))
  return rel


def write_manifest(out: pathlib.Path, claim: str, setting: str, runs: dict, *, steps: int,
                   switches=()) -> None:
  seeds = sorted({int(s) for by_seed in runs.values() for s in by_seed})
  manifest = {"claim": claim, "setting": setting, "quick": False, "extra_overrides": [],
              "seeds": seeds, "variants": list(runs), "steps": steps,
              "batch_trajectories": BATCH, "switches": list(switches), "runs": runs}
  (out / "claims").mkdir(parents=True, exist_ok=True)
  (out / "claims" / f"{claim}.json").write_text(json.dumps(manifest))
