"""One finished experiment run, read back from its sao-train outputs.

`load_run(run_dir)` reads `metrics.jsonl` (the format of `sao_jax.run.metrics`: one
JSON object per learner step, `{"step", "time", ...}`; evaluation rows carry
`eval/*` keys), `config.json` and the runner's `experiment.json`. A resumed run
may have logged a step twice (steps after its last checkpoint are redone):
the later row wins. The reward is `reward/mean`, the mean outcome of the
batch's trajectories; the trajectories a step trained on are counted from its
staleness histogram (`staleness/lag_k`: one count per trajectory), which holds
with or without sequence packing and with partial GRPO groups. `policy/*`
metrics are NaN on steps without a policy update (`policy/updated` 0: critic
warm-up, or a skipped non-finite update), where the step logs zeros; the flags of
the skip itself (`KEPT_ON_SKIPPED_STEPS`: `policy/updated`, and the contrast gate's
`policy/no_contrast_skip`, 1 exactly on such steps) are kept.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np

from sao_jax.run.metrics import read_metrics

STATE_FILE = "experiment.json"  # the runner's record of a run: variant, seed, schedule, done


# Policy metrics that describe the skip itself, kept on steps without a policy update.
KEPT_ON_SKIPPED_STEPS = ("policy/updated", "policy/no_contrast_skip")


@dataclasses.dataclass
class Run:
  variant: str
  seed: int
  steps: np.ndarray  # [N] learner steps with training metrics, ascending
  reward: np.ndarray  # [N] mean outcome of the batch's trajectories
  metrics: dict[str, np.ndarray]  # [N] per metric key, NaN where a step lacks it
  eval_steps: np.ndarray  # [E]
  eval_accuracy: np.ndarray  # [E] held-out greedy accuracy
  trained: int  # trajectories trained on
  dropped: int  # trajectories the learner's pipeline rejected (stale, malformed, ...)
  wall_s: float  # sum over the runner's sao-train invocations
  init: str  # run.init: the warm-start this run started from
  eval_episodes: int  # run.eval_episodes: the size of each held-out evaluation
  learner: dict = dataclasses.field(default_factory=dict)  # config.json's learner section
  # The runner's record of each sao-train invocation: end_step, exit_code, wall_s and,
  # from runs made since E3, the load average at its start and end (load_start, load_end).
  invocations: list = dataclasses.field(default_factory=list)

  @property
  def value_only_steps(self) -> int:
    """value_pretrain_steps + critic_warmup_steps: the steps before the policy's first
    update, when only the critic trains (0 in a config without them)."""
    return int(self.learner.get("value_pretrain_steps", 0)
               + self.learner.get("critic_warmup_steps", 0))

  def final_reward(self, fraction: float = 0.25) -> float:
    """Mean reward over the last `fraction` of the steps."""
    if not self.reward.size:
      return math.nan
    return float(np.nanmean(self.reward[-max(1, int(self.reward.size * fraction)):]))

  def accuracy_at(self, step: int) -> float:
    hit = np.nonzero(self.eval_steps == step)[0]
    return float(self.eval_accuracy[hit[-1]]) if hit.size else math.nan

  def accuracy_auc(self) -> float:
    """Area under the held-out accuracy curve over the run's evaluated span, per step:
    the trapezoid integral of accuracy over steps / (last - first evaluated step),
    i.e. the run's mean accuracy, which rewards learning early as well as far. NaN
    with fewer than two evaluations."""
    if self.eval_steps.size < 2:
      return math.nan
    steps, accuracy = self.eval_steps.astype(np.float64), self.eval_accuracy
    area = float(np.sum((accuracy[1:] + accuracy[:-1]) / 2 * np.diff(steps)))
    return area / float(steps[-1] - steps[0])

  def steps_to_accuracy(self, threshold: float) -> float:
    """The first evaluated step whose held-out accuracy is >= `threshold`; NaN if none."""
    hit = np.nonzero(self.eval_accuracy >= threshold)[0]
    return float(self.eval_steps[hit[0]]) if hit.size else math.nan

  @property
  def final_accuracy(self) -> float:
    return float(self.eval_accuracy[-1]) if self.eval_accuracy.size else math.nan

  def mean_lag(self) -> float:
    """Mean policy lag of the trajectories trained on (policy updates between a
    trajectory's first token and the step that trained it), from the staleness
    histogram: sum_k k * count_k / sum_k count_k. An asynchronous run's lag follows
    how fast its sampler ran beside its learner, i.e. the machine's load. NaN
    without a histogram."""
    counts = {int(key.rpartition("_")[2]): float(np.nansum(values))
              for key, values in self.metrics.items() if key.startswith("staleness/lag_")}
    total = sum(counts.values())
    return sum(k * c for k, c in counts.items()) / total if total else math.nan


def load_run(run_dir: str | pathlib.Path) -> Run:
  run_dir = pathlib.Path(run_dir)
  config = json.loads((run_dir / "config.json").read_text())
  state = json.loads((run_dir / STATE_FILE).read_text())
  train: dict[int, dict] = {}
  evals: dict[int, float] = {}
  for row in read_metrics(run_dir):
    if row["step"] < 0:
      continue
    if "reward/mean" in row:
      train[row["step"]] = row
    if "eval/accuracy" in row:
      evals[row["step"]] = row["eval/accuracy"]
  steps = np.array(sorted(train), dtype=np.int64)
  rows = [train[s] for s in steps]
  keys = sorted({k for row in rows for k in row if k not in ("step", "time")})
  metrics = {k: np.array([row.get(k, math.nan) for row in rows], np.float64) for k in keys}
  if "policy/updated" in metrics:
    skipped = metrics["policy/updated"] == 0
    for key in keys:
      if key.startswith("policy/") and key not in KEPT_ON_SKIPPED_STEPS:
        metrics[key][skipped] = math.nan
  last = rows[-1] if rows else {}
  return Run(variant=state["variant"], seed=state["seed"], steps=steps,
             reward=metrics.get("reward/mean", np.zeros(0)),
             metrics=metrics, eval_steps=np.array(sorted(evals), np.int64),
             eval_accuracy=np.array([evals[s] for s in sorted(evals)], np.float64),
             trained=int(sum(v for row in rows for k, v in row.items()
                             if k.startswith("staleness/lag_"))),
             dropped=int(sum(v for k, v in last.items() if k.startswith("dropped/"))),
             wall_s=float(sum(i["wall_s"] for i in state["invocations"])),
             init=config["run"]["init"], eval_episodes=config["run"]["eval_episodes"],
             learner=config["learner"], invocations=state["invocations"])


def latest_checkpoint(run_dir: pathlib.Path) -> int | None:
  """The step of the newest complete orbax checkpoint in run_dir (None: none yet)."""
  directory = run_dir / "checkpoints"
  if not directory.is_dir():
    return None
  steps = [int(p.name) for p in directory.iterdir() if p.name.isdigit()]
  return max(steps) if steps else None
