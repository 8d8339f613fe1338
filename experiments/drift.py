"""Why SAO drifts from weak starts, and what stops it (issue #17): a seeded study.

    .venv/bin/python -m experiments.drift --seeds 8 --jobs 2 --out runs/drift
    .venv/bin/python -m experiments.drift --seeds 8 --out runs/drift --report-only

Setting (`SETTING`): the sanity task (`configs/sanity_cpu.py`: "Answer with
the word red", reward 1 iff the reply is exactly the word) with replies of up
to 4 tokens instead of 1. The 60-step SFT warm-start teaches the format only,
so every run starts at chance (sampled reward ~0.25) and everything above it is
RL's; the longer replies give a policy that drifts room to do so (a word
followed by junk, or no end token, earns 0). Learning rate 3e-3 as in the
sanity setting: large enough that 60 steps decide a run, which also makes
drift, if the dynamics have it, show within those steps. Each run is one
`sao_jax.train.run` (its own SFT warm-start from the seed's init: seeds change
the model init, the task stream and sampling; arms of a seed share them).

Arms (`ARMS`) differ from plain SAO in one field each. Pre-registered before
the multi-seed runs (the single-seed runs that chose the arms are seed 0;
seed 0 of `lr_warmup` learned to 1.0 and then fell to 0 for 10 steps before
recovering, so a collapse is judged over the whole run, not only its end):
a run **collapsed** when the trailing 5-step mean of its training reward falls
below 0.1 at any step (under half of chance; a policy learning from chance on
this task has no reason to get there); it **learned** when its mean reward
over the last 10 steps is >= 0.9. Each arm's collapse count is compared with
plain SAO's by Fisher's exact test (two-sided); the report also gives the
final reward (mean +- 95% CI over seeds), steps to reach 0.9 (trailing 5-step
mean; the budget + 1 when never) and the area under the reward curve (mean
reward over all steps).

The report (`docs/drift.md`) is generated from the runs' metrics.jsonl.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import pathlib
import subprocess
import sys
from typing import Sequence

import numpy as np
from scipy import stats as scipy_stats

from experiments import stats

SETTING = ("sampler.max_new_tokens=4", "run.sft_steps=60", "learner.steps=60")
# name -> (variant, overrides on top of the variant's sanity config and SETTING).
ARMS = {
    "sao": ("sao", ()),
    "sao_centred": ("sao", ("algorithm.advantage_centering=batch_mean",)),
    "grpo": ("grpo", ()),
    "sao_lam1": ("sao", ("algorithm.lam_policy=1.0",)),
    "sao_critic_warmup": ("sao", ("learner.critic_warmup_steps=10",
                                  "learner.value_pretrain_steps=10")),
    "sao_lr_warmup": ("sao", ("learner.lr_warmup_steps=10",)),
    "sao_lr1e-3": ("sao", ("learner.policy_lr=1e-3",)),
    "running_mean": ("running_mean", ()),
}
COLLAPSED_BELOW = 0.1
LEARNED_AT = 0.9
FINAL_WINDOW = 10
SMOOTHING = 5
REPORT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "drift.md"


def run_dir(out: pathlib.Path, arm: str, seed: int) -> pathlib.Path:
  return out / f"{arm}-seed{seed}"


def run_one(out: pathlib.Path, arm: str, seed: int) -> pathlib.Path:
  """Trains one arm on one seed in a fresh process (unless already done)."""
  directory = run_dir(out, arm, seed)
  if (directory / "summary.json").exists():
    return directory
  variant, overrides = ARMS[arm]
  code = ("import sys; sys.path.insert(0, 'configs'); from sanity_cpu import sanity_config;"
          "from sao_jax import train; from sao_jax.config.loading import apply_overrides;"
          f"train.run(apply_overrides(sanity_config({variant!r}), sys.argv[1:]), log=print)")
  args = [*SETTING, *overrides, f"seed={seed}", f"env.seed={seed}", f"run.run_dir={directory}"]
  with open(out / f"{arm}-seed{seed}.log", "w") as log:
    subprocess.run([sys.executable, "-c", code, *args], check=True, stdout=log,
                   stderr=subprocess.STDOUT)
  return directory


def rewards(directory: pathlib.Path) -> np.ndarray:
  rows = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
  return np.array([row["reward/mean"] for row in rows if "reward/mean" in row])


@dataclasses.dataclass(frozen=True)
class ArmResult:
  arm: str
  seeds: list[int]
  final: list[float]  # mean reward over the last FINAL_WINDOW steps, per seed
  lowest: list[float]  # lowest trailing SMOOTHING-step mean reward, per seed
  steps_to_learned: list[int]
  auc: list[float]

  @property
  def collapsed(self) -> int:
    return sum(low < COLLAPSED_BELOW for low in self.lowest)

  @property
  def learned(self) -> int:
    return sum(f >= LEARNED_AT for f in self.final)


def arm_result(out: pathlib.Path, arm: str, seeds: Sequence[int]) -> ArmResult:
  done = [s for s in seeds if (run_dir(out, arm, s) / "summary.json").exists()]
  curves = [rewards(run_dir(out, arm, s)) for s in done]
  smooth = [stats.trailing_mean(c, SMOOTHING) for c in curves]

  def steps_to(curve):
    hit = np.nonzero(curve >= LEARNED_AT)[0]
    return int(hit[0]) if hit.size else len(curve) + 1

  return ArmResult(arm, done, [float(c[-FINAL_WINDOW:].mean()) for c in curves],
                   [float(s.min()) for s in smooth], [steps_to(s) for s in smooth],
                   [float(c.mean()) for c in curves])


def fisher_vs(base: ArmResult, other: ArmResult) -> float:
  """Two-sided Fisher's exact p-value of collapse counts, `other` vs `base`."""
  table = [[other.collapsed, len(other.final) - other.collapsed],
           [base.collapsed, len(base.final) - base.collapsed]]
  return float(scipy_stats.fisher_exact(table).pvalue)


def report(out: pathlib.Path, seeds: Sequence[int]) -> str:
  results = {arm: arm_result(out, arm, seeds) for arm in ARMS}
  base = results["sao"]
  lines = [
      "# SAO drift from weak starts: cause and remedy (issue #17)", "",
      "Generated by `.venv/bin/python -m experiments.drift --report-only` from the runs in "
      f"`{out}`; do not edit by hand. Setting, arms and the pre-registered criteria: the "
      "docstring of `experiments/drift.py` (and README, \"Stability\").", "",
      f"Collapsed: the trailing {SMOOTHING}-step mean training reward falls below "
      f"{COLLAPSED_BELOW} at some step; learned: mean reward over the last {FINAL_WINDOW} "
      f"steps >= {LEARNED_AT}. p: Fisher's exact test (two-sided) of the arm's collapse count "
      "against plain SAO's.", "",
      "| arm | seeds | collapsed | learned | p (collapse vs sao) | final reward | "
      "steps to 0.9 | reward AUC |", "|---|---|---|---|---|---|---|---|"]
  for arm, result in results.items():
    if not result.final:
      continue
    p = "-" if arm == "sao" or not base.final else f"{fisher_vs(base, result):.4f}"
    lines.append(
        f"| {arm} | {len(result.final)} | {result.collapsed} | {result.learned} | {p} | "
        f"{stats.summarize(result.final).format()} | "
        f"{stats.summarize(result.steps_to_learned).format(1)} | "
        f"{stats.summarize(result.auc).format()} |")
  lines += ["", "Per run (final reward):", "", "| arm | " + " | ".join(
      f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
  for arm, result in results.items():
    by_seed = dict(zip(result.seeds, result.final))
    lines.append(f"| {arm} | " + " | ".join(
        f"{by_seed[s]:.2f}" if s in by_seed else "-" for s in seeds) + " |")
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="experiments.drift", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seeds", type=int, default=8)
  parser.add_argument("--jobs", type=int, default=1, help="runs in parallel")
  parser.add_argument("--out", default="runs/drift")
  parser.add_argument("--report-only", action="store_true")
  args = parser.parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  seeds = list(range(args.seeds))
  if not args.report_only:
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
      for directory in pool.map(lambda job: run_one(out, *job),
                                [(arm, s) for s in seeds for arm in ARMS]):
        print(f"done: {directory}", flush=True)
  REPORT.write_text(report(out, seeds))
  print(REPORT.read_text())


if __name__ == "__main__":
  main()
