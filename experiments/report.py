"""Writes docs/research/results.md and docs/research/results/*.png from the experiment runs.

    .venv/bin/python -m experiments.report [--out runs/experiments] [--report docs/research/results.md]

For every claim in `experiments.claims` whose manifest (`OUT/claims/<claim>.json`)
exists: a table per variant of mean ± 95% CI across seeds (t-distribution,
`experiments.stats`), the number of seeds, the sample budget and the wall-clock
(ordering claims add the held-out accuracy AUC and the steps to +ACCURACY_GAIN);
a plot; and a verdict sentence computed from the numbers. Variants of a seed
share its warm-start, so a comparison is judged on the paired difference
(variant A minus variant B, per seed): it "agrees" with the paper when the 95%
CI of that difference lies on the paper's side of 0, "disagrees" when on the
other side, and is "inconclusive" when it contains 0; the sentence also says
whether the (wider, unpaired) per-variant CIs overlap. Nothing in the text
below the tables is written by hand.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import pathlib
from typing import Sequence

import numpy as np

from experiments import archive
from experiments import claims as claims_lib
from experiments import plots, stats
from experiments.warm_start import DONE_FILE
from experiments.runs import Run, load_run

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_REPORT = ROOT / "docs" / "research" / "results.md"
NOTES = ROOT / "docs" / "research" / "results_notes.md"  # the hand-written part, linked
PAPER_STABLE_STEPS = 1000
# Ordering claims' steps-to-threshold: steps until held-out accuracy first reaches
# the run's own step-0 accuracy plus this gain.
ACCURACY_GAIN = 0.1


def _fmt_wall(seconds: float) -> str:
  return f"{seconds / 60:.1f} min" if math.isfinite(seconds) else "n/a"


def _load(out: pathlib.Path, manifest: dict) -> dict[str, list[Run]]:
  return {name: [load_run(out / rel) for _, rel in sorted(manifest["runs"].get(name, {}).items(),
                                                          key=lambda kv: int(kv[0]))]
          for name in manifest["variants"]}


def _label(name: str) -> str:
  return claims_lib.VARIANTS[name].label


def _comparisons(claim: claims_lib.Claim, values: dict[str, dict[int, float]], what: str,
                 lower_is_better: bool = False) -> tuple[str, str]:
  """(overall verdict, one sentence listing each comparison) for one quantity given per
  variant and seed; each comparison is judged on its paired (same-seed) difference."""
  parts, verdicts = [], []
  for better, worse in claim.expected:
    a, b = values[better], values[worse]
    difference = (stats.paired_difference(b, a) if lower_is_better else
                  stats.paired_difference(a, b))
    verdict = stats.verdict(difference)
    verdicts.append(verdict)
    seeds = sorted(set(a) & set(b))
    mdd = stats.minimum_detectable_difference(
        [(b[s] - a[s]) if lower_is_better else (a[s] - b[s]) for s in seeds])
    order = (worse, better) if lower_is_better else (better, worse)
    per_variant = [stats.summarize(list(v.values())) for v in (a, b)]
    detail = (f"{_label(order[0])} - {_label(order[1])} on the same seed: "
              f"{difference.format()} over {difference.n} seeds"
              + ("" if difference.n >= 2 else ", fewer than 2") + f"; per variant "
              f"{per_variant[0].format()} vs {per_variant[1].format()}, whose CIs "
              + ("overlap" if stats.intervals_overlap(*per_variant) else "do not overlap"))
    relation = "<" if lower_is_better else ">"
    if verdict == stats.INCONCLUSIVE:  # what the seeds could have detected
      detail += (f"; minimum detectable difference at 80% power {mdd:.3f}" if math.isfinite(mdd)
                 else "; no minimum detectable difference (fewer than 2 seeds)")
    parts.append(f"{_label(better)} {relation} {_label(worse)}: **{verdict}** ({detail})")
  return stats.overall(verdicts), f"{what}: " + "; ".join(parts) + "."


def _budget(manifest: dict, groups: dict[str, list[Run]]) -> str:
  planned = manifest["steps"] * manifest["batch_trajectories"]
  trained = {n: stats.summarize([r.trained for r in runs]) for n, runs in groups.items()}
  realised = ", ".join(f"{_label(n)} {s.mean:.0f}" for n, s in trained.items() if s.n)
  return (f"{manifest['steps']} learner steps x {manifest['batch_trajectories']} trajectories = "
          f"{planned} trajectories per run (trained on, mean per run: {realised})")


def _shared_init(groups: dict[str, list[Run]]) -> str:
  by_seed: dict[int, set] = {}
  for runs in groups.values():
    for run in runs:
      by_seed.setdefault(run.seed, set()).add((run.init, run.accuracy_at(0)))
  same = all(len(v) == 1 for v in by_seed.values())
  return ("every variant of a seed started from the same warm-start (same weights, same "
          "step-0 held-out accuracy)" if same else
          "WARNING: variants of a seed did not share their starting point: "
          + "; ".join(f"seed {s}: {sorted(map(str, v))}" for s, v in by_seed.items() if len(v) > 1))


def _ordering(claim, manifest, groups, figure: pathlib.Path) -> tuple[str, list[str]]:
  window = max(1, manifest["steps"] // 20)
  last = sorted({int(r.eval_steps[-1]) for runs in groups.values() for r in runs
                 if r.eval_steps.size})
  rows = ["| variant | seeds | held-out acc. @ step 0 | final held-out acc. (step "
          f"{', '.join(map(str, last)) or '-'}) | training reward, "
          "last 25% of steps | accuracy gain since step 0 | held-out acc. AUC | "
          f"steps to +{ACCURACY_GAIN:.2f} (runs reaching it) | trajectories dropped | "
          "wall-clock per run |", "|---|---|---|---|---|---|---|---|---|---|"]
  final = {n: {r.seed: r.final_accuracy for r in runs} for n, runs in groups.items()}
  reward = {n: {r.seed: r.final_reward() for r in runs} for n, runs in groups.items()}
  auc = {n: {r.seed: r.accuracy_auc() for r in runs} for n, runs in groups.items()}
  for name, runs in groups.items():
    start = stats.summarize([r.accuracy_at(0) for r in runs])
    gain = stats.summarize([r.final_accuracy - r.accuracy_at(0) for r in runs])
    reach = [r.steps_to_accuracy(r.accuracy_at(0) + ACCURACY_GAIN) for r in runs]
    reached = stats.summarize(reach)  # NaN (never reached) is left out of the mean
    rows.append(f"| {_label(name)} | {len(runs)} | {start.format()} | "
                f"{stats.summarize(list(final[name].values())).format()} | "
                f"{stats.summarize(list(reward[name].values())).format()} | "
                f"{gain.format()} | {stats.summarize(list(auc[name].values())).format()} | "
                f"{reached.format(0)} ({reached.n}/{len(runs)}) | "
                f"{stats.summarize([r.dropped for r in runs]).format(1)} "
                f"| {_fmt_wall(stats.summarize([r.wall_s for r in runs]).mean)} |")
  verdict, sentence = _comparisons(claim, final, "Final held-out accuracy")
  _, reward_sentence = _comparisons(claim, reward, "Training reward (last 25% of steps)")
  _, auc_sentence = _comparisons(claim, auc, "Held-out accuracy AUC (mean over the run)")
  plots.learning_curves({_label(n): r for n, r in groups.items()}, figure, window=window)
  return verdict, [*rows, "", f"Comparison (on final held-out accuracy): **{verdict}**. "
                   f"{sentence} {reward_sentence} {auc_sentence}", "",
                   _evaluation_noise(groups)]


def _evaluation_noise(groups: dict[str, list[Run]]) -> str:
  """How noisy one final held-out accuracy is by itself: the binomial standard error
  sqrt(p (1 - p) / n) of n greedy episodes, averaged over runs. A paired difference of
  two runs carries sqrt(2) of it, which a CI from few seeds can understate."""
  errors = [math.sqrt(r.final_accuracy * (1 - r.final_accuracy) / r.eval_episodes)
            for runs in groups.values() for r in runs if math.isfinite(r.final_accuracy)]
  if not errors:
    return ""
  error = sum(errors) / len(errors)
  episodes = sorted({r.eval_episodes for runs in groups.values() for r in runs})
  return (f"Noise of one evaluation: a final held-out accuracy from "
          f"{'/'.join(map(str, episodes))} episodes has a binomial standard error of "
          f"{error:.3f} (mean over runs), so the same-seed difference of two runs carries "
          f"about {math.sqrt(2) * error:.3f} of evaluation noise alone; with few seeds the "
          "CI of a difference can come out narrower than that, and such a verdict rests on "
          "little.")


def _realignment(claim, manifest, groups, figure: pathlib.Path) -> tuple[str, list[str]]:
  switches = manifest["switches"]
  bounds = [0, *switches, manifest["steps"]]
  rows = ["| variant | switch @ step | seeds | pre-switch reward | steps to 90% of it | "
          "not recovered within the phase |", "|---|---|---|---|---|---|"]
  per_switch: dict[int, dict[str, dict[int, float]]] = {}
  annotations: dict[str, list[str]] = {_label(n): [] for n in groups}
  for i, switch in enumerate(switches):
    phase = bounds[i + 2] - switch
    for name, runs in groups.items():
      found = [stats.recovery_steps(r.steps, r.reward, switch, bounds[i + 2],
                                    pre_window=max(1, (switch - bounds[i]) // 4),
                                    window=max(1, phase // 10)) for r in runs]
      # Not recovered within the phase: censored at the phase length (a lower bound).
      steps_ = [f.phase_steps if f.steps is None and f.pre_level > 0 else
                (f.steps if f.steps is not None else math.nan) for f in found]
      missed = sum(f.steps is None and f.pre_level > 0 for f in found)
      per_switch.setdefault(switch, {})[name] = {r.seed: s for r, s in zip(runs, steps_)}
      summary = stats.summarize(steps_)
      pre = stats.summarize([f.pre_level for f in found])
      annotations[_label(name)].append(summary.format(1) + (
          f" ({missed} of {len(runs)} not recovered)" if missed else ""))
      rows.append(f"| {_label(name)} | {switch} | {len(runs)} | {pre.format()} | "
                  f"{summary.format(1)} | {missed} of {len(runs)} (counted as {phase}) |")
  verdicts, sentences = [], []
  for switch, values in per_switch.items():
    verdict, sentence = _comparisons(claim, values, f"Switch at step {switch}, steps to recover",
                                     lower_is_better=True)
    verdicts.append(verdict)
    sentences.append(sentence)
  verdict = stats.overall(verdicts)
  window = max(1, min(b - a for a, b in zip(bounds, bounds[1:])) // 10)
  plots.realignment({_label(n): r for n, r in groups.items()}, figure, switches=switches,
                    recovery=annotations, window=window)
  return verdict, [*rows, "", f"Comparison: **{verdict}**. " + " ".join(sentences)
                   + " A pre-switch reward of 0 leaves nothing to recover (n/a)."]


# Diagnostics whose growth over a run signals drift toward instability (entropy: collapse).
GROWTH_METRICS = (("policy/kl_k3", "KL"), ("policy/grad_norm", "policy grad norm"),
                  ("value/grad_norm", "value grad norm"), ("policy/entropy", "entropy"))


def _stability(claim, manifest, groups, figure: pathlib.Path) -> tuple[str, list[str]]:
  steps = manifest["steps"]
  window = max(1, steps // 20)
  rows = ["| variant | seeds | collapsed | final reward (last 25%) | non-finite updates | "
          + " | ".join(title for _, title in plots.STABILITY_METRICS) + " |",
          "|---|---|---|---|---|" + "---|" * len(plots.STABILITY_METRICS)]
  collapsed = {}
  for name, runs in groups.items():
    collapsed[name] = [stats.collapsed(r.reward, window=window) for r in runs]
    cells = []
    for key, _ in plots.STABILITY_METRICS:
      tail = [float(np.nanmedian(r.metrics[key][-max(1, r.steps.size // 4):]))
              for r in runs if key in r.metrics and np.isfinite(r.metrics[key]).any()]
      cells.append(stats.summarize(tail).format())
    skips = max((float(np.nanmax(r.metrics["nonfinite_skips"])) for r in runs
                 if "nonfinite_skips" in r.metrics), default=math.nan)
    rows.append(f"| {_label(name)} | {len(runs)} | {sum(collapsed[name])} of {len(runs)} | "
                f"{stats.summarize([r.final_reward() for r in runs]).format()} | {skips:.0f} | "
                + " | ".join(cells) + " |")
  growth_rows = ["| variant | " + " | ".join(f"{title} growth" for _, title in GROWTH_METRICS)
                 + " |", "|---|" + "---|" * len(GROWTH_METRICS)]
  for name, runs in groups.items():
    growth_rows.append(f"| {_label(name)} | " + " | ".join(
        stats.summarize([stats.growth(r.metrics[key]) for r in runs if key in r.metrics])
        .format(2) for key, _ in GROWTH_METRICS) + " |")
  subject = claim.variants[0]  # the SAO variant the claim is about; the others run alongside
  sao = collapsed.get(subject, [])
  # Two halves: the subject does not collapse, and the paper's GRPO does (more often).
  # A count of 0 of n is reported with its Clopper-Pearson upper bound: 0 of 8 still
  # allows a true collapse rate up to ~37%.
  sao_half = stats.DISAGREES if any(sao) else stats.AGREES if sao else stats.NOT_MEASURABLE
  low, high = stats.clopper_pearson(sum(sao), len(sao)) if sao else (math.nan, math.nan)
  span = (f"over {steps} steps" + (f", shorter than the paper's ~{PAPER_STABLE_STEPS}: the "
                                   f"claim is tested only that far" if steps < PAPER_STABLE_STEPS
                                   else ""))
  halves, sentences = [sao_half], [
      f"{_label(subject)} does not collapse: **{sao_half}** — collapsed in {sum(sao)} of "
      f"{len(sao)} seeds {span} (95% Clopper-Pearson interval of its collapse rate "
      f"{low:.2f}-{high:.2f})."]
  for name, counts in collapsed.items():
    if name == subject:
      continue
    p = stats.fisher_fewer_collapses(sum(sao), len(sao), sum(counts), len(counts))
    half = stats.AGREES if p < stats.ALPHA else stats.INCONCLUSIVE
    halves.append(half)
    other_low, other_high = stats.clopper_pearson(sum(counts), len(counts))
    sentences.append(
        f"{_label(name)} collapses more often: **{half}** — collapsed in {sum(counts)} of "
        f"{len(counts)} seeds (95% Clopper-Pearson {other_low:.2f}-{other_high:.2f}); "
        f"one-sided Fisher's exact test that {_label(subject)} collapses less: p = {p:.3f}"
        + ("; the collapse the paper reports for GRPO was not reproduced" if not any(counts)
           else "") + ".")
  skips = [float(np.nanmean(r.metrics["policy/no_contrast_skip"]))
           for r in groups.get(subject, []) if "policy/no_contrast_skip" in r.metrics]
  if skips:  # what the gate buys is partly not training
    sentences.append(f"{_label(subject)}'s contrast gate skipped the policy update on "
                     f"{stats.summarize(skips).format()} of its steps (mean ± 95% CI over "
                     "seeds): on those steps it did not train the policy at all.")
  verdict = stats.overall(halves)
  plots.stability({_label(n): r for n, r in groups.items()}, figure, window=window)
  return verdict, [*rows, "", f"Comparison: **{verdict}** (both halves must agree). "
                   + " ".join(sentences) + f" Collapse: the trailing mean reward ({window} "
                   "steps) ends below half its best value. Diagnostic columns: the median over "
                   "the last 25% of steps per run, mean ± 95% CI across seeds.", "",
                   *growth_rows, "",
                   "Growth: a run's median over the last quarter of its policy updates divided "
                   "by the median over the first quarter (1: steady; a run drifting toward "
                   "instability shows KL and gradient norms growing well above 1), mean ± 95% "
                   "CI across seeds."]


# A training reward at or below this is at the floor: nothing was learned (or kept).
FLOOR = 0.02


def _ordering_check(manifest, groups) -> tuple[bool, str]:
  """The variants can differ only if the policy moved: held-out accuracy at step 0 off
  the floor and ceiling, and a training reward above the floor."""
  start = stats.summarize([r.accuracy_at(0) for runs in groups.values() for r in runs]).mean
  reward = stats.summarize([float(np.nanmean(r.reward)) for runs in groups.values()
                            for r in runs if r.reward.size]).mean
  ok = FLOOR < start < 1 - FLOOR and reward > FLOOR
  return ok, (f"held-out accuracy at step 0 {start:.3f} (registered: within "
              f"({FLOOR}, {1 - FLOOR})), mean training reward over all runs {reward:.3f} "
              f"(registered: > {FLOOR})")


def _realignment_check(manifest, groups) -> tuple[bool, str]:
  """Re-alignment speed can be compared only if something re-aligns: after the first
  switch, at least one run (of any variant) is back at 90% of its pre-switch reward
  within the phase. If none is, every steps-to-recover is censored at the phase length
  and a tie says nothing about the claim."""
  switches = manifest["switches"]
  if not switches:
    return False, "no preference switch in the runs"
  bounds = [0, *switches, manifest["steps"]]
  switch, end = switches[0], bounds[2]
  found = [stats.recovery_steps(r.steps, r.reward, switch, end,
                                pre_window=max(1, switch // 4),
                                window=max(1, (end - switch) // 10))
           for runs in groups.values() for r in runs]
  recovered = sum(f.steps is not None for f in found)
  after = stats.summarize([float(np.nanmean(r.reward[(r.steps >= switch) & (r.steps < end)]))
                           for runs in groups.values() for r in runs]).mean
  return recovered > 0, (f"after the first switch (step {switch}) {recovered} of {len(found)} "
                         f"runs recovered 90% of their pre-switch reward within the phase "
                         f"(registered: at least one); mean training reward over the phase "
                         f"{after:.3f}")


def _stability_check(manifest, groups) -> tuple[bool, str]:
  """A collapse can be seen only in a run that learned something: the subject's best
  trailing reward above the floor in at least one run."""
  window = max(1, manifest["steps"] // 20)
  runs = groups.get(next(iter(groups)), [])
  best = [float(stats.trailing_mean(r.reward, window).max()) for r in runs if r.reward.size]
  learned = sum(b > FLOOR for b in best)
  return learned > 0, (f"the subject's trailing {window}-step reward rose above {FLOOR} in "
                       f"{learned} of {len(runs)} runs (registered: at least one)")


CHECKS = {"ordering": _ordering_check, "realignment": _realignment_check,
          "stability": _stability_check}


def judge(claim: claims_lib.Claim, computed: str, check: tuple[bool, str], seeds: int) -> str:
  """The claim's verdict: "setting failed" when its manipulation check fails (the contrast
  the claim is about never arose, so the numbers cannot speak to it); "incomplete" with
  fewer finished seeds per variant than the claim registered; else the verdict computed
  from the numbers."""
  if not check[0]:
    return stats.SETTING_FAILED
  if seeds < claim.seeds:
    return f"{stats.INCOMPLETE} ({seeds} of {claim.seeds} seeds)"
  return computed


def _runs_table(groups: dict[str, list[Run]]) -> list[str]:
  rows = ["Per run:", "", "| variant | seed | held-out acc. @ step 0 | final held-out acc. | "
          "training reward, last 25% | trajectories trained | dropped | wall-clock |",
          "|---|---|---|---|---|---|---|---|"]
  for name, runs in groups.items():
    for r in runs:
      rows.append(f"| {_label(name)} | {r.seed} | {r.accuracy_at(0):.3f} | "
                  f"{r.final_accuracy:.3f} | {r.final_reward():.3f} | {r.trained} | {r.dropped} "
                  f"| {_fmt_wall(r.wall_s)} |")
  return rows


ANALYSES = {"ordering": _ordering, "realignment": _realignment, "stability": _stability}


def _warm_starts(out: pathlib.Path, used: dict[str, set[str]]) -> list[str]:
  """The table of the warm-starts that reported runs started from, with the settings
  of those runs (`used`: warm-start directory name -> settings)."""
  lines = []
  for name in sorted(used, key=lambda n: (sorted(used[n]), n)):
    records = [out / "warm_start" / name / file for file in (DONE_FILE, archive.WARM_RECORD)]
    done = next((path for path in records if path.is_file()), None)  # made here, or restored
    if done is None:  # a run from elsewhere (--set run.init=...): nothing to show
      continue
    record = json.loads(done.read_text())
    validation = "-"
    if record.get("target_accuracy"):  # SFT stopped at a validation-accuracy target
      validation = (f"{record['validation'][-1][1]:.3f} (target {record['target_accuracy']:.2f}"
                    f"{'' if record['reached_target'] else ', not reached'})")
    lines.append(f"| {name} | {', '.join(sorted(used[name]))} | {record['sft_steps']} | "
                 f"{record['final_sft_loss']:.3f} | {validation} | "
                 f"{_fmt_wall(record['wall_s'])} |")
  if not lines:
    return []
  return ["Warm-starts (one per seed and setting, shared by all variants; validation accuracy: "
          "greedy, on tasks disjoint from the held-out set, at the last SFT check):", "",
          "| warm-start | setting | SFT steps | final SFT loss | validation accuracy "
          "| wall-clock |",
          "|---|---|---|---|---|---|", *lines, ""]


def _untested() -> list[str]:
  return ["Claims of the paper not tested here:", "",
          *(f"- {claim}: **{stats.NOT_TESTED}** — {reason}." for claim, reason in
            claims_lib.UNTESTED), ""]


# Experiments registered apart from the claims, each with its own generated report.
REGISTERED = (("E1: single rollout against groups where groups fail", "e1.md"),
              ("E2: stability under the paper's semantics (paper SAO, GRPO, GRPO+DIS)", "e2.md"),
              ("E3: the paper's SAO against GRPO at equal wall-clock, rollout-bound", "e3.md"),
              ("E1-paper: E1 with the paper's SAO and critic schedule", "e1_paper.md"))


def _registered(report: pathlib.Path) -> list[str]:
  """Links to the registered experiments' reports (docs/research/), with their verdicts,
  the setting each holds for and the critic check, as their reports state them."""
  lines = []
  for title, name in REGISTERED:
    path = NOTES.parent / name
    verdict, setting = "not run yet", ""
    if path.is_file():
      text = path.read_text().splitlines()
      found = [line for line in text if line.startswith("**Verdict")]
      verdict = found[0].split("): ")[-1].split(".**")[0] if found else "see the report"
      holds = [line for line in text if line.startswith("The result holds for:")]
      # Only a check added after a registration sits beside the verdict; a registered
      # one (E3, E1-paper) is already in the verdict's words.
      critic = [line.split("By this check the verdict reads: ")[-1] for line in text
                if line.startswith("Critic check") and "By this check" in line]
      setting = "".join([f" {holds[0]}" if holds else "",
                         f" By the critic check added after the registration: {critic[0]}"
                         if critic else ""])
    # Linked once its report exists (a link to a missing page breaks the docs site).
    named = f"[{title}]({_relative(path, report)})" if path.is_file() else title
    lines.append(f"- {named}: **{verdict}**.{setting}")
  return ["Experiments registered apart from the claims (issues #38 and #50):", "", *lines,
          ""]


def _relative(target: pathlib.Path, report: pathlib.Path) -> str:
  return os.path.relpath(target.resolve(), report.resolve().parent)


def check_report_path(report: pathlib.Path, flag: str = "--report") -> None:
  """ValueError unless a markdown report can be written at `report`: not a directory,
  and no file where one of its parent directories goes. The claim and drift scripts
  call this before their runs, which take hours, not when the report is written."""
  if report.is_dir():
    raise ValueError(f"{flag} {str(report)!r} is a directory; pass a file path, e.g. "
                     f"{report / 'results.md'}")
  for parent in report.parents:
    if parent.exists():
      if not parent.is_dir():
        raise ValueError(f"{flag} {str(report)!r}: {str(parent)!r} is a file, not a directory; "
                         "pass a path in a directory")
      break


def write_report(out: pathlib.Path, report: pathlib.Path, *, skip_missing: bool = False
                 ) -> pathlib.Path:
  """Writes `report` (markdown) and its figures under `report.parent / "results"`.

  Every claim gets a section, "not run yet" where `out` has no runs of it; with
  `skip_missing` those claims are left out (a report of one claim's runs). The
  figures of `results.md` are `<claim>.png`; another report's carry its name
  (`claim6.md`: `claim6_<claim>.png`), so a one-claim report beside `results.md`
  does not overwrite the figure `results.md` shows."""
  figures = report.parent / "results"
  prefix = "" if report.name == "results.md" else f"{report.stem}_"
  summary = ["| claim | setting | seeds | budget per run (trajectories) | verdict |",
             "|---|---|---|---|---|"]
  sections = []
  used_warm_starts: collections.defaultdict[str, set[str]] = collections.defaultdict(set)
  for claim in claims_lib.CLAIMS:
    path = out / "claims" / f"{claim.name}.json"
    header = f"## Claim {claim.number}: {claim.title}"
    command = f"`.venv/bin/python -m experiments.{claim.name} --seeds 3`"
    if not path.is_file() and skip_missing:
      continue
    if not path.is_file():
      summary.append(f"| {claim.number} | {claim.setting} | - | - | {stats.NOT_TESTED} (no "
                     "runs) |")
      sections += [header, "", f"Not tested: no runs of it under `--out` (not run yet, or its "
                   f"runs were not archived). Run: {command}.", ""]
      continue
    manifest = json.loads(path.read_text())
    groups = _load(out, manifest)
    for run in (r for runs in groups.values() for r in runs):
      used_warm_starts[pathlib.Path(run.init).parent.name].add(claim.setting)
    figure = figures / f"{prefix}{claim.name}.png"
    computed, body = ANALYSES[claim.kind](claim, manifest, groups, figure)
    seeds = min(len(runs) for runs in groups.values())
    check = CHECKS[claim.kind](manifest, groups)
    verdict = judge(claim, computed, check, seeds)
    budget = manifest["steps"] * manifest["batch_trajectories"]
    summary.append(f"| {claim.number} | {claim.setting} | {seeds} | {budget} | {verdict} |")
    wall = sum(r.wall_s for runs in groups.values() for r in runs)
    ran = " ".join([f"--seeds {len(manifest['seeds'])}", *(["--quick"] if manifest["quick"] else
                                                         []),
                    *(f"--set {o}" for o in manifest["extra_overrides"])])
    sections += [header, "", f"Paper: {claim.paper}.", "",
                 f"Ran: `.venv/bin/python -m experiments.{claim.name} {ran}`"
                 + (" (**quick mode: a pipeline check, not a measurement**)" if manifest["quick"]
                    else "") + ".", "",
                 f"Budget: {_budget(manifest, groups)}. Init: {_shared_init(groups)}. "
                 f"Wall-clock of all its runs: {_fmt_wall(wall)}.", ""]
    sections += [f"Note: {claim.note}", ""] if claim.note else []
    sections += [f"**Verdict: {verdict}.** Manipulation check "
                 f"{'passed' if check[0] else 'FAILED'}: {check[1]}. Registered seeds: "
                 f"{claim.seeds}; finished: {seeds}. Which SAO ran: "
                 f"{', '.join(_label(n) for n in claim.variants if n.startswith('sao'))}.", ""]
    sections += [*body, "", f"![{claim.name}](results/{figure.name})", "",
                 *_runs_table(groups), ""]
  shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
  target = report.resolve()
  flags = (([f"--report {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}"]
            if target != DEFAULT_REPORT else []) + (["--skip-missing"] if skip_missing else []))
  text = ["# Reproducing the paper's claims at small scale", "",
          f"Generated by `.venv/bin/python -m experiments.report "
          f"{' '.join([f'--out {shown}', *flags])}` on "
          f"{datetime.date.today().isoformat()}; do not edit by hand. Commands and set-up: "
          "docs/research/claims.md.", "",
          "Method: every variant of a claim trains the same number of trajectories "
          "(`learner.steps` x `learner.batch_trajectories`) from the same per-seed warm-start; "
          "seeds change the model init, task stream and sampling. Numbers are means ± the "
          "half-width of the 95% confidence interval across seeds (Student t, n - 1 degrees of "
          "freedom). The starting policy differs much more between seeds than variants differ "
          "within one, so each comparison is judged on the paired difference (the two variants' "
          "values on the same seed, averaged over seeds): it agrees with the paper when the 95% "
          "CI of the difference lies on the paper's side of 0, disagrees when it lies on the "
          "other side, and is inconclusive when it contains 0; each sentence also says whether "
          "the per-variant CIs in the table overlap. Held-out accuracy: greedy decoding on a "
          "fixed set of generated "
          "tasks never trained on. Training reward: mean outcome of the batch's trajectories "
          "(sampled, temperature 1). The verdict in the table is the comparison's only when "
          "the claim's manipulation check passed (else **setting failed**: the contrast the "
          "claim is about never arose) and every variant finished the seeds the claim "
          "registered (else **incomplete**); an inconclusive comparison states the smallest "
          "difference its seeds could have detected (80% power).", "", *summary, "",
          *_untested(), *_registered(report), f"Notes written by hand on these results: "
          f"[{NOTES.name}]({_relative(NOTES, report)}).", "", *_warm_starts(out, used_warm_starts),
          *sections]
  report.parent.mkdir(parents=True, exist_ok=True)
  report.write_text("\n".join(text).rstrip() + "\n")
  return report


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="experiments.report", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=str(ROOT / "runs" / "experiments"),
                      help="the claim scripts' --out directory")
  parser.add_argument("--report", default=str(DEFAULT_REPORT))
  parser.add_argument("--skip-missing", action="store_true",
                      help="leave out claims with no runs in --out (default: 'not run yet')")
  args = parser.parse_args(argv)
  out = pathlib.Path(args.out).resolve()
  if not (out / "claims").is_dir():
    parser.exit(2, f"error: {out} holds no experiment runs (no claims/ directory); run a "
                   "claim script first, e.g. python -m experiments.claim1_ordering --quick\n")
  try:
    check_report_path(pathlib.Path(args.report))
  except ValueError as error:
    parser.exit(2, f"error: {error}\n")
  print(f"wrote {write_report(out, pathlib.Path(args.report), skip_missing=args.skip_missing)}")


if __name__ == "__main__":
  main()
