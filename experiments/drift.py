"""Why SAO drifts from weak starts, and what stops it (issue #17): a seeded study.

    .venv/bin/python -m experiments.drift --seeds 8 --jobs 2 --out runs/drift
    .venv/bin/python -m experiments.drift --seeds 8 --out runs/drift --report-only
    .venv/bin/python -m experiments.drift --seeds 8 --jobs 2 --steps 1000 \
        --arms sao_centred_lr_warmup,grpo --out runs/drift1000 --report docs/research/drift1000.md

Setting (`SETTING`): the sanity task (`configs/sanity_cpu.py`: "Answer with
the word red", reward 1 iff the reply is exactly the word) with replies of up
to 4 tokens instead of 1. The 60-step SFT warm-start teaches the format only,
so every run starts at chance (sampled reward ~0.25) and everything above it is
RL's; the longer replies give a policy that drifts room to do so (a word
followed by junk, or no end token, earns 0). Learning rate 3e-3 as in the
sanity setting: large enough that 60 steps decide a run, which also makes
drift, if the dynamics have it, show within those steps. Each run is one
`sao_jax.jobs.train.run` (its own SFT warm-start from the seed's init: seeds change
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

`sao_centred_lr_warmup` was added after the pre-registration, when seed 1 of
`sao_centred` collapsed by a second route (the first Adam update, see
docs/research/drift-notes.md); its criteria are the same. The lower-learning-rate arms
(`*_lr1e-3`, `*_lr3e-4`: 3x and 10x below the setting's 3e-3, for SAO and
GRPO) were added later too, with the same criteria: they are this setting's
counterpart of the issue's "policy lr 1e-5 and 3e-5" (the claim settings use
2e-5), asking whether a smaller step alone removes the drift and what it
costs in learning speed.

The long runs (`--steps 1000`, `docs/research/drift1000.md`) ask the paper's stability
question (claim 6: ~1000 steps without collapse) of the remedy this study chose
(`sao_centred_lr_warmup`, beside GRPO) in this setting, where a run costs
minutes instead of claim 6's ~50 (8 seeds x 2 variants x 1000 steps of
`configs/experiments/tool_math.py` would be ~13 hours on 2 cores). Pre-registered
before they ran: the same criteria, judged over all 1000 steps (collapsed: the
trailing 5-step mean reward below 0.1 at any step; learned: the last 10 steps'
mean >= 0.9); the claim holds for an arm with no collapse in 8 seeds.

`sao_centred_lr_warmup_contrast` (the remedy plus
`algorithm.require_reward_contrast`: no policy update on a batch whose
trajectories all earned the same reward) was added after seed 0 of the remedy's
1000-step run collapsed at step ~600, from a saturated reward of 1.0: over
steps 500-600 its median policy gradient norm was 1.7e-6 while its median
update norm was 0.07 (Adam normalising the critic's residual error in batches
of all-1 rewards into full-size steps), a random walk that ended in a one-token
reply earning 0 everywhere, from which centred advantages of all-0 batches
cannot climb back. Its criteria are the same, and it runs in both studies
(60 steps: does the gate cost learning speed? 1000 steps: does it stop the
late collapse?). `grpo_contrast` (GRPO with the gate; 1000 steps only) was
added when GRPO's 1000-step runs collapsed too (3 of the first 5 seeds): GRPO's
all-equal batches have exactly zero gradient, yet Adam keeps stepping along
its momentum on them, and a rare batch with one failure, after a quiet
stretch, moved seed 0 by 0.64 in one update (entropy 0.001 -> 2.9). The gate
applies neither. Same criteria.

The report (`docs/research/drift.md`, or `--report`) is generated from the runs' metrics.jsonl.
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

from experiments import stats

SETTING = ("sampler.max_new_tokens=4", "run.sft_steps=60")
STEPS = 60  # learner steps per run (--steps)
# name -> (variant, overrides on top of the variant's sanity config and SETTING).
ARMS = {
    "sao": ("sao", ()),
    "sao_centred": ("sao", ("algorithm.advantage_centering=batch_mean",)),
    "sao_centred_lr_warmup": ("sao", ("algorithm.advantage_centering=batch_mean",
                                      "learner.lr_warmup_steps=10")),
    "sao_centred_lr_warmup_contrast": ("sao", ("algorithm.advantage_centering=batch_mean",
                                               "learner.lr_warmup_steps=10",
                                               "algorithm.require_reward_contrast=true")),
    "grpo": ("grpo", ()),
    "grpo_contrast": ("grpo", ("algorithm.require_reward_contrast=true",)),
    "sao_lam1": ("sao", ("algorithm.lam_policy=1.0",)),
    "sao_critic_warmup": ("sao", ("learner.critic_warmup_steps=10",
                                  "learner.value_pretrain_steps=10")),
    "sao_lr_warmup": ("sao", ("learner.lr_warmup_steps=10",)),
    "sao_lr1e-3": ("sao", ("learner.policy_lr=1e-3",)),
    "sao_lr3e-4": ("sao", ("learner.policy_lr=3e-4",)),
    "grpo_lr1e-3": ("grpo", ("learner.policy_lr=1e-3",)),
    "grpo_lr3e-4": ("grpo", ("learner.policy_lr=3e-4",)),
    "running_mean": ("running_mean", ()),
}
COLLAPSED_BELOW = 0.1
LEARNED_AT = 0.9
FINAL_WINDOW = 10
SMOOTHING = 5
EARLY_UPDATES = 4  # the first policy updates, where the Adam route to a collapse starts
REPORT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "research" / "drift.md"


def run_dir(out: pathlib.Path, arm: str, seed: int) -> pathlib.Path:
  return out / f"{arm}-seed{seed}"


def run_one(out: pathlib.Path, arm: str, seed: int, steps: int = STEPS) -> pathlib.Path:
  """Trains one arm on one seed for `steps` learner steps in a fresh process (unless
  already done)."""
  directory = run_dir(out, arm, seed)
  if (directory / "summary.json").exists():
    return directory
  variant, overrides = ARMS[arm]
  code = ("import sys; sys.path.insert(0, 'configs'); from sanity_cpu import sanity_config;"
          "from sao_jax.jobs import train; from sao_jax.config.loading import apply_overrides;"
          f"train.run(apply_overrides(sanity_config({variant!r}), sys.argv[1:]), log=print)")
  args = [*SETTING, f"learner.steps={steps}", *overrides, f"seed={seed}", f"env.seed={seed}",
          f"run.run_dir={directory}"]
  with open(out / f"{arm}-seed{seed}.log", "w") as log:
    subprocess.run([sys.executable, "-c", code, *args], check=True, stdout=log,
                   stderr=subprocess.STDOUT)
  return directory


def step_rows(directory: pathlib.Path) -> list[dict]:
  """The run's per-step metric rows (those with a training reward)."""
  rows = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
  return [row for row in rows if "reward/mean" in row]


def rewards(directory: pathlib.Path) -> np.ndarray:
  return np.array([row["reward/mean"] for row in step_rows(directory)])


def early_peak(directory: pathlib.Path, key: str) -> float:
  """The largest value of metric `key` over the first EARLY_UPDATES steps that
  updated the policy. With "policy/entropy" (nats per action token; ln 384 =
  5.95 is uniform over the vocabulary) the first Adam steps' route to a
  collapse shows; with "advantage/neg_frac", how much of the batch they push down."""
  updated = [row[key] for row in step_rows(directory) if row.get("policy/update_norm", 0.0) > 0]
  return max(updated[:EARLY_UPDATES])


def sampled_entropy(cfg, episodes: int = 64) -> float:
  """The entropy (nats per action token) of the policy in the latest checkpoint of the
  run `cfg` describes, estimated on its own episodes: -mean log pi(a_t | s_t) over the
  action tokens of `episodes` episodes of the run's task, sampled with the run's
  sampler settings from seed `run.eval_seed`. For tempered sampling that is the
  tempered distribution's entropy, like the learner's "policy/entropy" at temperature 1.

  Unlike `early_peak`, the same checkpoint gives the same value on every run: the
  learner's metric is measured on each step's batch, and after the first update which
  policy versions a batch holds depends on when the sampler picked up new weights.
  The episodes run on the blocking runner (`Episodes(overlap=False)`): with environment
  steps overlapping decoding, the order episodes finish in (hence the float32 sum's
  order) and which of them prefill or share prompt pages together (hence the last bits
  of their log-probs) follow the machine's timing, and the same checkpoint measured
  0.92069417 or 0.92069405 (issue #48's failure of the drift route test)."""
  from sao_jax.envs.registry import make_tasks
  from sao_jax.jobs import evaluate

  cfg, mesh, chat, params, meta = evaluate.checkpoint_policy(cfg)
  env_cfg = dataclasses.replace(cfg.env, seed=cfg.run.eval_seed)
  runner = evaluate.Episodes(cfg, cfg.sampler, env_cfg, chat, params,
                             int(meta["policy_version"]), mesh, overlap=False)
  trajs = runner.run(make_tasks(env_cfg), episodes, seed=cfg.run.eval_seed, desc="entropy",
                     leave=False)
  logp = np.concatenate([t.behavior_logp[t.action_mask.astype(bool)] for t in trajs])
  return float(-logp.mean())


@dataclasses.dataclass(frozen=True)
class ArmResult:
  arm: str
  seeds: list[int]
  final: list[float]  # mean reward over the last FINAL_WINDOW steps, per seed
  lowest: list[float]  # lowest trailing SMOOTHING-step mean reward, per seed
  steps_to_learned: list[int]
  auc: list[float]
  entropy_peak: list[float]  # early_peak of the entropy, per seed
  negative_share: list[float]  # early_peak of the negative-advantage share, per seed

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
                   [float(c.mean()) for c in curves],
                   [early_peak(run_dir(out, arm, s), "policy/entropy") for s in done],
                   [early_peak(run_dir(out, arm, s), "advantage/neg_frac") for s in done])


def fisher_vs(base: ArmResult, other: ArmResult) -> float:
  """Two-sided Fisher's exact p-value of collapse counts, `other` vs `base`."""
  return stats.fisher_collapses(other.collapsed, len(other.final), base.collapsed,
                                len(base.final))


def report(out: pathlib.Path, seeds: Sequence[int], arms: Sequence[str] = tuple(ARMS),
           steps: int = STEPS, path: pathlib.Path = REPORT) -> str:
  """The markdown report of `arms` x `seeds` in `out`, to be written to `path` (its
  first lines name the command that regenerates it)."""
  results = {arm: arm_result(out, arm, seeds) for arm in arms}
  base = results.get("sao") or results[arms[0]]  # the reference of the Fisher tests
  options = ([f"--steps {steps}"] if steps != STEPS else []) + (
      [f"--arms {','.join(arms)}"] if tuple(arms) != tuple(ARMS) else []) + (
      [f"--report {path}"] if path != REPORT else [])
  command = " ".join([f"--seeds {len(seeds)}", *options, f"--out {out}", "--report-only"])
  lines = [
      "# SAO drift from weak starts: cause and remedy (issue #17)"
      + ("" if steps == STEPS else f", {steps}-step runs"), "",
      f"Generated by `.venv/bin/python -m experiments.drift {command}` from the runs in "
      f"`{out}` ({steps} learner steps each); do not edit by hand. Setting, arms and the "
      "pre-registered criteria: the docstring of `experiments/drift.py` (and docs/research/drift-notes.md, "
      "\"Why SAO drifted\").", "",
      f"Collapsed: the trailing {SMOOTHING}-step mean training reward falls below "
      f"{COLLAPSED_BELOW} at some step; learned: mean reward over the last {FINAL_WINDOW} "
      f"steps >= {LEARNED_AT}. p: Fisher's exact test (two-sided) of the arm's collapse count "
      f"against {base.arm}'s.", "",
      f"| arm | seeds | collapsed | learned | p (collapse vs {base.arm}) | final reward | "
      "steps to 0.9 | reward AUC |", "|---|---|---|---|---|---|---|---|"]
  for arm, result in results.items():
    if not result.final:
      continue
    p = "-" if arm == base.arm or not base.final else f"{fisher_vs(base, result):.4f}"
    lines.append(
        f"| {arm} | {len(result.final)} | {result.collapsed} | {result.learned} | {p} | "
        f"{stats.summarize(result.final).format()} | "
        f"{stats.summarize(result.steps_to_learned).format(1)} | "
        f"{stats.summarize(result.auc).format()} |")
  lines += ["", f"The first {EARLY_UPDATES} policy updates (mean +- 95% CI over seeds): the "
            "peak entropy (nats per action token; uniform over the vocabulary is ln 384 = "
            "5.95) and the largest share of action tokens with a negative advantage.", "",
            "| arm | peak entropy | runs above 4 nats | negative-advantage share |",
            "|---|---|---|---|"]
  for arm, result in results.items():
    if result.final:
      lines.append(f"| {arm} | {stats.summarize(result.entropy_peak).format()} | "
                   f"{sum(e > 4 for e in result.entropy_peak)}/{len(result.final)} | "
                   f"{stats.summarize(result.negative_share).format()} |")
  lines += ["", "Per run (final reward):", "", "| arm | " + " | ".join(
      f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
  for arm, result in results.items():
    if not result.final:
      continue
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
  parser.add_argument("--steps", type=int, default=STEPS, help="learner steps per run")
  parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms to run")
  parser.add_argument("--report", default=str(REPORT), help="the markdown report to write")
  parser.add_argument("--report-only", action="store_true")
  args = parser.parse_args(argv)
  arms = args.arms.split(",")
  unknown = sorted(set(arms) - set(ARMS))
  if unknown:
    parser.error(f"--arms: unknown {unknown}; known: {', '.join(ARMS)}")
  for flag, value in (("--seeds", args.seeds), ("--jobs", args.jobs), ("--steps", args.steps)):
    if value < 1:
      parser.error(f"{flag} {value}: expected at least 1")
  out = pathlib.Path(args.out)
  if out.exists() and not out.is_dir():
    parser.error(f"--out {args.out!r} is a file; pass a runs directory (created if missing)")
  from experiments import report as report_lib  # matplotlib: only once arguments are fine

  try:  # before the runs, which take hours, not when the report is written
    report_lib.check_report_path(pathlib.Path(args.report))
  except ValueError as error:
    parser.error(str(error))
  out.mkdir(parents=True, exist_ok=True)
  seeds = list(range(args.seeds))
  if not args.report_only:
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
      for directory in pool.map(lambda job: run_one(out, *job, steps=args.steps),
                                [(arm, s) for s in seeds for arm in arms]):
        print(f"done: {directory}", flush=True)
  path = pathlib.Path(args.report)
  path.write_text(report(out, seeds, arms, args.steps, path))
  print(path.read_text())


if __name__ == "__main__":
  main()
