"""E2 (issue #38): stability under the paper's own semantics, 1000 steps, no remedies.

    nice -n 19 .venv/bin/python -m experiments.e2_paper_stability --seeds 8 --jobs 1 \\
        --out /work/exp_runs/e2 --report docs/research/e2.md
    .venv/bin/python -m experiments.e2_paper_stability --out DIR --report-only

PRE-REGISTRATION (committed before any multi-seed run; the report names this
module's registration commit, `REGISTRATION`):

- Question: does the paper's SAO (`sao`: critic GAE, DIS, K=2, frozen attention;
  no centring, no contrast gate, no lr warm-up) train 1000 steps without
  collapse where the paper's GRPO (`grpo`, PPO clip, groups of 8) and GRPO with
  DIS (`grpo_dis`) collapse? The paper: SAO stable for ~1000 steps, GRPO
  collapses near step 160.
- Setting: `configs/experiments/sanity_long.py`, the drift study's 4-token
  sanity task (`experiments/drift.py`) at its lr 3e-3, 1000 learner steps x 32
  trajectories for every variant, seeds 0..7 (>= 8 seeds registered: `SEEDS`);
  all variants of a seed start from one shared warm-start.
- Collapse (drift.py's criterion, unchanged): the trailing 5-step mean of the
  training reward falls below 0.1 at any step. Learned: the mean over the last
  10 steps is >= 0.9.
- Primary test: one-sided Fisher's exact test that `sao` collapses less often
  than `grpo` (alpha 0.05); the same test against `grpo_dis` is secondary.
  Each arm's collapse count is given with its 95% Clopper-Pearson interval.
- Manipulation check (the setting can show a collapse at all): across all runs,
  the mean training reward over the first 5 steps is >= 0.15, i.e. runs start
  above the collapse line (chance is ~0.25). If it fails the report reads
  "setting failed", whatever the counts.
- Secondary: learned count, final reward (last 10 steps), steps to a trailing
  5-step reward of 0.9 (the run length + 1 when never), reward AUC (mean over
  all steps), first collapse step.
- Verdict: with fewer than 8 seeds finished per arm, "incomplete (n of 8
  seeds)"; else "supported" if the primary p < 0.05, "not supported" otherwise,
  and the report also states whether `sao`'s own count is 0 (the paper's "no
  collapse") with its Clopper-Pearson upper bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
from typing import Sequence

import numpy as np

from experiments import claims as claims_lib
from experiments import critic, runner, stats
from experiments.runs import Run, load_run

SEEDS = 8  # registered: the verdict needs this many finished seeds per arm
COLLAPSED_BELOW = 0.1
SMOOTHING = 5
LEARNED_AT = 0.9
FINAL_WINDOW = 10
START_WINDOW = 5
START_AT_LEAST = 0.15  # manipulation check: runs start above the collapse line
ALPHA = 0.05
SUBJECT, PRIMARY, SECONDARY = "sao", "grpo", "grpo_dis"
ROOT = pathlib.Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "research" / "e2.md"

EXPERIMENT = claims_lib.Claim(
    "e2_paper_stability", 0, "paper SAO trains 1000 steps without collapse; GRPO collapses",
    "SAO trains stably for ~1000 steps; GRPO collapses near step 160", "sanity_long",
    "stability", (SUBJECT, PRIMARY, SECONDARY))


@dataclasses.dataclass(frozen=True)
class ArmResult:
  variant: str
  seeds: list[int]
  start: list[float]  # mean reward over the first START_WINDOW steps, per seed
  lowest: list[float]  # lowest trailing SMOOTHING-step mean
  first_collapse: list[float]  # step of the first collapse (NaN: none)
  final: list[float]
  steps_to_learned: list[int]
  auc: list[float]

  @property
  def n(self) -> int:
    return len(self.seeds)

  @property
  def collapsed(self) -> int:
    return sum(low < COLLAPSED_BELOW for low in self.lowest)

  @property
  def learned(self) -> int:
    return sum(f >= LEARNED_AT for f in self.final)


def arm_result(variant: str, runs: Sequence[Run]) -> ArmResult:
  curves = [np.asarray(r.reward, np.float64) for r in runs]
  smooth = [stats.trailing_mean(c, SMOOTHING) for c in curves]

  def first(mask, steps):
    hit = np.nonzero(mask)[0]
    return hit[0] if hit.size else None

  collapse = [first(s < COLLAPSED_BELOW, r.steps) for s, r in zip(smooth, runs)]
  learned = [first(s >= LEARNED_AT, r.steps) for s, r in zip(smooth, runs)]
  return ArmResult(
      variant, [r.seed for r in runs], [float(c[:START_WINDOW].mean()) for c in curves],
      [float(s.min()) for s in smooth],
      [float(r.steps[i]) if i is not None else math.nan for i, r in zip(collapse, runs)],
      [float(c[-FINAL_WINDOW:].mean()) for c in curves],
      [int(r.steps[i]) if i is not None else int(r.steps.size) + 1
       for i, r in zip(learned, runs)],
      [float(c.mean()) for c in curves])


def verdict(results: dict[str, ArmResult]) -> tuple[str, list[str]]:
  """(verdict, sentences) by the registered rules (module docstring)."""
  sao, grpo = results[SUBJECT], results[PRIMARY]
  starts = [s for r in results.values() for s in r.start]
  if not starts:
    return stats.NOT_TESTED, ["No run has finished."]
  start = float(np.mean(starts))
  if start < START_AT_LEAST:
    return stats.SETTING_FAILED, [
        f"Manipulation check failed: the mean training reward over the first {START_WINDOW} "
        f"steps is {start:.3f} < {START_AT_LEAST}, so runs start at the collapse line."]
  sentences = [f"Manipulation check passed: runs start at a mean training reward of "
               f"{start:.3f} over their first {START_WINDOW} steps (>= {START_AT_LEAST})."]
  for name, arm in results.items():
    if arm.n:
      low, high = stats.clopper_pearson(arm.collapsed, arm.n)
      sentences.append(f"`{name}` collapsed in {arm.collapsed} of {arm.n} seeds (95% "
                       f"Clopper-Pearson {low:.3f}-{high:.3f}).")
  for other in (PRIMARY, SECONDARY):
    arm = results[other]
    if sao.n and arm.n:
      p = stats.fisher_fewer_collapses(sao.collapsed, sao.n, arm.collapsed, arm.n)
      sentences.append(f"One-sided Fisher's exact test that `{SUBJECT}` collapses less than "
                       f"`{other}`: p = {p:.4f}" + (" (primary)." if other == PRIMARY else
                                                   " (secondary)."))
  if min(sao.n, grpo.n) < SEEDS:
    return (f"{stats.INCOMPLETE} ({min(sao.n, grpo.n)} of {SEEDS} seeds)", sentences)
  p = stats.fisher_fewer_collapses(sao.collapsed, sao.n, grpo.collapsed, grpo.n)
  return ("supported" if p < ALPHA else "not supported"), sentences


def report(out: pathlib.Path, path: pathlib.Path = REPORT) -> str:
  manifest_path = out / "claims" / f"{EXPERIMENT.name}.json"
  manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {
      "runs": {}}
  runs, results = {}, {}
  for name in EXPERIMENT.variants:
    by_seed = sorted(manifest["runs"].get(name, {}).items(), key=lambda kv: int(kv[0]))
    runs[name] = [load_run(out / rel) for _, rel in by_seed]
    results[name] = arm_result(name, runs[name])
  outcome, sentences = verdict(results)
  lines = [
      "# E2: stability under the paper's semantics (issue #38)", "",
      f"Generated by `.venv/bin/python -m experiments.e2_paper_stability --out {out} "
      f"--report {path} --report-only`; do not edit by hand. Design and criteria: the "
      f"pre-registration in `experiments/e2_paper_stability.py` (registration commit: "
      f"{stats.registration_commit(pathlib.Path(__file__))}). Setting: `configs/experiments/sanity_long.py`.", "",
      f"**Verdict (paper SAO collapses less than the paper's GRPO): {outcome}.** "
      + " ".join(sentences), "",
      *_holds_for(runs, outcome),
      f"Collapsed: the trailing {SMOOTHING}-step mean training reward falls below "
      f"{COLLAPSED_BELOW} at some step; learned: mean over the last {FINAL_WINDOW} steps >= "
      f"{LEARNED_AT}.", "",
      "| variant | seeds | collapsed (95% CP) | first collapse step | learned | final reward | "
      "steps to 0.9 | reward AUC |", "|---|---|---|---|---|---|---|---|"]
  for name, arm in results.items():
    if not arm.n:
      lines.append(f"| `{name}` | 0 | - | - | - | - | - | - |")
      continue
    low, high = stats.clopper_pearson(arm.collapsed, arm.n)
    firsts = ", ".join(f"{s:.0f}" for s in arm.first_collapse if math.isfinite(s)) or "-"
    lines.append(f"| `{name}` | {arm.n} | {arm.collapsed} ({low:.2f}-{high:.2f}) | {firsts} | "
                 f"{arm.learned} | {stats.summarize(arm.final).format()} | "
                 f"{stats.summarize(arm.steps_to_learned).format(1)} | "
                 f"{stats.summarize(arm.auc).format()} |")
  seeds = sorted({s for arm in results.values() for s in arm.seeds})
  if seeds:
    lines += ["", "Per run (final reward; `c@N`: collapsed first at step N):", "",
              "| variant | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|" + "---|" * len(seeds)]
    for name, arm in results.items():
      cells = {s: f"{f:.2f}" + (f" c@{c:.0f}" if math.isfinite(c) else "")
               for s, f, c in zip(arm.seeds, arm.final, arm.first_collapse)}
      lines.append(f"| `{name}` | " + " | ".join(cells.get(s, "-") for s in seeds) + " |")
  return "\n".join(lines) + "\n"


def _holds_for(runs: dict[str, list[Run]], outcome: str) -> list[str]:
  """The setting the verdict holds for, from the runs' configs, and the critic check
  (added after the registration: not part of the verdict)."""
  if not all(runs.values()):
    return []
  check = critic.critic_check(runs["sao"], critic.DIAGNOSTIC_THRESHOLD)
  arms = "; ".join(f"`{name}` with {critic.schedule(arm[0])}" for name, arm in runs.items())
  return [f"The result holds for: {arms}; compared per learner step at equal trajectories "
          "per step (not wall-clock); task: the sanity bandit (one prompt, reward 1 iff the "
          "reply of up to 4 tokens is the word), a 2-layer, 64-wide model on CPU.", "",
          "Critic check (added after the registration, not part of the registered verdict; "
          f"`sao`): {check.text}. By this check the verdict reads: "
          f"**{critic.verdict_text(outcome, check)}**.", ""]


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="experiments.e2_paper_stability", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seeds", type=int, default=SEEDS)
  parser.add_argument("--jobs", type=int, default=1)
  parser.add_argument("--out", default=str(ROOT / "runs" / "e2"))
  parser.add_argument("--report", default=str(REPORT))
  parser.add_argument("--quick", action="store_true", help="pipeline check, numbers mean nothing")
  parser.add_argument("--report-only", action="store_true")
  args = parser.parse_args(argv)
  for flag, value in (("--seeds", args.seeds), ("--jobs", args.jobs)):
    if value < 1:
      parser.error(f"{flag} {value}: expected at least 1")
  out = pathlib.Path(args.out).resolve()
  if out.exists() and not out.is_dir():
    parser.error(f"--out {args.out!r} is a file; pass a runs directory (created if missing)")
  failures = []
  if not args.report_only:
    failures = runner.run_claim(EXPERIMENT, seeds=args.seeds, quick=args.quick, extra=(),
                                out=out)
  path = pathlib.Path(args.report)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(report(out, path))
  print(path.read_text())
  if failures:
    parser.exit(1, "failed runs:\n" + "\n".join(failures) + "\n")


if __name__ == "__main__":
  main()
