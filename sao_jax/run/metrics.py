"""Run outputs: metrics JSONL, TensorBoard events, W&B, a progress line, PNG curves.

    logger = MetricsLogger(run_dir, total_steps=cfg.learner.steps, loggers=cfg.run.loggers)
    logger.write(step, {"reward/mean": 0.4, ...})    # JSONL + each of `loggers`
    print(logger.progress(step, metrics))            # one human line with ETA
    plot_curves(run_dir)                             # run_dir/curves.png

Every learner step appends one JSON object `{"step": N, "time": t, ...metrics}`
to `run_dir/metrics.jsonl`; evaluation results are written the same way with
keys under `eval/`. The plot is drawn from that file alone, so it can be made
again at any time (`sao-train --plot RUN_DIR`). `loggers` (`config.run.LOGGERS`)
add TensorBoard events in run_dir/tensorboard and Weights & Biases
(`sao_jax.run.tracking`).

Restarting (`logger.rewind(s)` before a run resumed from the checkpoint at
step s writes; `rewind(None)` before a fresh run in a used directory): an
interrupted run may have written rows the new one writes again, the training
rows of steps >= s and the evaluations after step s (the one at s evaluated the
checkpointed policy and is not repeated), or every row for a fresh run. Those
rows are removed from `metrics.jsonl` (a new file renamed over the old one), a
line torn by the crash is dropped, and the TensorBoard events are rewritten
from the rows kept (a new event file, whose purge marker hides older events
from step s on, then the older files are removed), so each step appears once
in the file, the plot and TensorBoard. (W&B cannot remove rows: see `tracking`.)

`run_dir` may be a bucket URL (`sao_jax.storage`): an object cannot be appended to,
so there the logger keeps the rows and uploads the whole file with every row (one
atomic object write: readers see the rows up to the last one written, never a torn
line; its cost grows with the run, the file's size per row). They are read back from
the bucket when the logger starts, and the rewind filters them. TensorBoard needs
local files (refused by `config.run` for a bucket run_dir).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import time
from typing import Iterable, Mapping

import numpy as np

from sao_jax import storage
from sao_jax.config.run import DEFAULT_LOGGERS
from sao_jax.data import failures
from sao_jax.run.critic_window import BIAS_WINDOW, EV_WINDOW
from sao_jax.data.pipeline import BatchInfo, Drops
from sao_jax.run import phases, timing

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "curves.png"
TENSORBOARD_DIR = "tensorboard"


# Engine finish reasons of a turn cut by a length limit (sao_jax.sampler.engine).
LENGTH_CUTS = ("max_new_tokens", "max_seq_len")
# Lags with a histogram key of their own (`staleness/lag_0` ...); longer ones share
# `staleness/lag_16_plus`, so a large data.max_lag (or a peer's records claiming an
# old first version) cannot add a metric key per lag seen: every row and TensorBoard
# series, for the rest of the run.
LAG_KEYS = 16
# Data sources (`reward/source/<name>`) and episode metrics (`episodes/metric/<name>`)
# with keys of their own, the first seen in the process; later ones share
# `.../other`: the names come from task files and trajectories, and each key is a
# metrics column and a TensorBoard series for the rest of the run.
MAX_NAMED_KEYS = 32
PROGRESS_KINDS = 3  # drop kinds named in the progress line
_named: dict[str, dict[str, None]] = {"source": {}, "metric": {}}


def _named_key(kind: str, name: str) -> str:
  seen = _named[kind]
  if name not in seen and len(seen) < MAX_NAMED_KEYS:
    seen[name] = None
  return name if name in seen else "other"


def batch_metrics(info: BatchInfo, drops: Drops) -> dict[str, float]:
  """Host-side metrics of a batch: staleness histogram (`staleness/lag_k`, lags of
  `LAG_KEYS` and more counted together), version spans, drops so far,
  and the share of episodes that ended by the turn budget (`episodes/max_turns_frac`)
  or by a length limit: out of context, or a last turn cut at max_new_tokens /
  max_seq_len (`episodes/length_cut_frac`), and the share in which the environment
  ran a tool (`episodes/tool_call_frac`); the mean outcome per data source
  (`reward/source/<source>`, tasks that name one) and the mean of each episode
  metric (`episodes/metric/<name>`: the numbers an environment or reward function
  reports beside the reward), over the episodes that report it; the mean and largest
  release delay of the batch's prompt groups (`groups/release_delay_s`, group mode:
  `GroupDataset`); the weight-channel
  network faults the samplers waited out (`weights/sampler_waits`) and the peer
  errors and refused versions they counted (`weights/sampler_errors`), as reported
  with this batch's trajectories; where the samplers' time went while they made them
  (`time/sampler/<phase>_s`, `run.phases`)."""
  out = {"staleness/mean": float(np.mean(info.lags)) if info.lags.size else 0.0,
         "staleness/max": float(np.max(info.lags)) if info.lags.size else 0.0,
         "staleness/multi_version_frac": float(np.mean(info.version_spans > 0))
                                          if info.version_spans.size else 0.0,
         "batch/padding_rows": float(info.padding_rows),
         "batch/mean_length": float(np.mean(info.lengths)) if info.lengths.size else 0.0,
         timing.BATCH_TRAJECTORIES_KEY: float(info.lags.size)}
  if info.group_release_s:
    out["groups/release_delay_s"] = float(np.mean(info.group_release_s))
    out["groups/release_delay_max_s"] = float(np.max(info.group_release_s))
  top = int(out["staleness/max"])
  for lag in range(min(top, LAG_KEYS - 1) + 1):
    out[f"staleness/lag_{lag}"] = float(np.sum(info.lags == lag))
  if top >= LAG_KEYS:
    out[f"staleness/lag_{LAG_KEYS}_plus"] = float(np.sum(info.lags >= LAG_KEYS))
  if info.ends:
    out["episodes/max_turns_frac"] = float(np.mean([end == "max_turns" for end, _ in info.ends]))
    out["episodes/length_cut_frac"] = float(np.mean(
        [end == "truncated" or last in LENGTH_CUTS for end, last in info.ends]))
  if info.tool_calls:
    out["episodes/tool_call_frac"] = float(np.mean(np.asarray(info.tool_calls) > 0))
  by_source: dict[str, list[float]] = {}
  for source, outcome in zip(info.sources, info.outcomes):
    if source:
      by_source.setdefault(_named_key("source", source), []).append(outcome)
  for source, values in by_source.items():
    out[f"reward/source/{source}"] = float(np.mean(values))
  by_metric: dict[str, list[float]] = {}
  for metrics in info.episode_metrics:
    for name, value in metrics.items():
      by_metric.setdefault(_named_key("metric", name), []).append(value)
  for name, values in by_metric.items():
    out[f"episodes/metric/{name}"] = float(np.mean(values))
  if info.weight_waits or info.weight_errors:
    out["weights/sampler_waits"] = float(sum(info.weight_waits))
    out["weights/sampler_errors"] = float(sum(info.weight_errors))
  out.update(phases.sampler_metrics(tuple(r for r in info.sampler_phases if r)))
  # Stale drops from the first step on, 0 until there are any: the column a
  # rollout-bound comparison reads is never missing.
  for reason, count in {"stale": 0, **drops}.items():
    out[f"dropped/{reason}"] = float(count)
  return out


class MetricsLogger:
  """Appends metrics to JSONL and each of `loggers`; formats the progress line.

  `wandb_project`, `name` and `config` describe the W&B run when "wandb" is one of
  `loggers` (ValueError saying how to install it when the package is missing).
  """

  def __init__(self, run_dir: str | pathlib.Path, *, total_steps: int,
               loggers: tuple[str, ...] = DEFAULT_LOGGERS, wandb_project: str = "",
               name: str = "", config: dict | None = None):
    self.run_dir = storage.as_path(run_dir)
    self._bucket = storage.is_url(run_dir)
    if not self._bucket:  # a bucket has no directories: its objects' names make them
      self.run_dir.mkdir(parents=True, exist_ok=True)
    self._wandb = None
    if "wandb" in loggers:  # first: the one that can refuse (not installed)
      from sao_jax.run.tracking import WandbLogger

      # W&B writes local files: beside a bucket's rows, in its default directory.
      self._wandb = WandbLogger(None if self._bucket else self.run_dir, project=wandb_project,
                                name=name, config=config or {})
    self._tb = None
    if "tensorboard" in loggers:
      from tensorboardX import SummaryWriter  # heavy import, only where a run writes

      self._summary_writer = SummaryWriter
      self._tb = SummaryWriter(str(self.run_dir / TENSORBOARD_DIR))
    self._jsonl = None if self._bucket else open(self.run_dir / METRICS_FILE, "a",
                                                  encoding="utf-8")
    # A bucket's rows, all uploaded again with each one (objects cannot be appended to).
    self._rows = _rows(self.run_dir / METRICS_FILE) if self._bucket and (
        self.run_dir / METRICS_FILE).is_file() else []
    self._total = total_steps
    self._first: tuple[float, int] | None = None  # (time, step) of the first progress line
    self._tokens = 0.0  # tokens trained since the first progress line
    self.last_eval: dict[str, float] = {}
    # Where a resumed run's clock starts (`timing.carried_over` of the rows `rewind` kept).
    self.carried = timing.carried_over([])

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    clean = {k: float(v) for k, v in metrics.items()}
    if any(k.startswith("eval/") for k in clean):
      self.last_eval = {k: v for k, v in clean.items() if k.startswith("eval/")}
    if self._first is not None:
      self._tokens += clean.get("tokens/total", 0.0)
    row = {"step": step, "time": time.time(), **clean}
    if self._bucket:
      self._rows.append(row)
      write_jsonl(self.run_dir / METRICS_FILE, self._rows)
    else:
      self._jsonl.write(json.dumps(row) + "\n")
      self._jsonl.flush()
    self._add_scalars(step, clean)
    if self._wandb is not None:
      self._wandb.write(step, clean)

  def _add_scalars(self, step: int, metrics: Mapping[str, float]) -> None:
    if self._tb is None:
      return
    for name, value in metrics.items():
      if math.isfinite(value):
        self._tb.add_scalar(name, value, step)

  def rewind(self, step: int | None) -> None:
    """Forgets the rows a run starting at checkpoint `step` (None: afresh) writes again."""
    path = self.run_dir / METRICS_FILE
    if self._bucket:
      kept = [] if step is None else [row for row in self._rows if not _replayed(row, step)]
      self._rows = kept
      write_jsonl(path, kept)
    else:
      self._jsonl.close()
      kept = [] if step is None else [row for row in _rows(path) if not _replayed(row, step)]
      write_jsonl(path, kept)
      self._jsonl = open(path, "a", encoding="utf-8")
    self.carried = timing.carried_over(kept)
    if self._tb is not None:
      self._rewind_tensorboard(step, kept)

  def _rewind_tensorboard(self, step: int | None, kept: list[dict]) -> None:
    self._tb.close()
    events = self.run_dir / TENSORBOARD_DIR
    older = sorted(events.glob("events.out.tfevents.*"))
    self._tb = self._summary_writer(
        str(events), purge_step=None if step is None else min([step] + [r["step"] for r in kept]),
        filename_suffix=f".{'fresh' if step is None else f'resumed-at-{step}'}.{os.getpid()}")
    for row in kept:
      self._add_scalars(row["step"], {k: v for k, v in row.items() if k not in ("step", "time")})
    self._tb.flush()
    for old in older:  # everything they held is in the new file now
      old.unlink()

  def progress(self, step: int, metrics: Mapping[str, float]) -> str:
    """`step 12/200 | reward 0.41 | eval 0.35 | lag 0.8 | critic EV 0.31 bias -0.05 |
    dropped 5 (env_failure/ValueError 3, too_long 2) | 1,234 tok/s | 1.84 s/step (wait
    61%, compute 35%, publish 2%) | sampler decode 70%, prefill 12%, env_wait 9% | ETA
    3m10s` (the largest phases of the step and of the samplers, `run.phases.progress_part`; the
    drops so far, when there are any; the critic's explained variance and bias over
    the window of `critic_window.WINDOW_STEPS` steps, variants with a critic; EV "--"
    while the window's returns do not vary).

    Rates count from the first line on, so warm-start, evaluation before it and
    compilation do not distort them.
    """
    if self._first is None:
      self._first = (time.monotonic(), step)
    elapsed = time.monotonic() - self._first[0]
    done = step - self._first[1]
    eta = elapsed / done * (self._total - step - 1) if done else float("nan")
    parts = [f"step {step + 1}/{self._total}",
             f"reward {metrics.get('reward/mean', float('nan')):.3f}"]
    if "eval/accuracy" in self.last_eval:
      parts.append(f"eval {self.last_eval['eval/accuracy']:.3f}")
    if "staleness/mean" in metrics:
      parts.append(f"lag {metrics['staleness/mean']:.1f}")
    if EV_WINDOW in metrics:
      ev = metrics[EV_WINDOW]
      parts.append(f"critic EV {'--' if math.isnan(ev) else f'{ev:.2f}'} "
                   f"bias {metrics[BIAS_WINDOW]:+.2f}")
    dropped = failures.kinds({key.removeprefix("dropped/"): value for key, value in
                              metrics.items() if key.startswith("dropped/")})
    if dropped:  # so far, by kind: each first message is logged once (jobs.train)
      parts.append(f"dropped {sum(dropped.values())} (" + ", ".join(
          f"{kind} {count}" for kind, count in list(dropped.items())[:PROGRESS_KINDS]) +
          (", ..." if len(dropped) > PROGRESS_KINDS else "") + ")")
    parts.append(f"{self._tokens / elapsed:,.0f} tok/s" if done else "-- tok/s")
    timing_part = phases.progress_part(metrics)
    if timing_part:  # where the step's time went (run.phases)
      parts.append(timing_part)
    parts.append(f"ETA {int(eta // 60)}m{int(eta % 60):02d}s" if done else "ETA --")
    return " | ".join(parts)

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.close()


def _replayed(row: dict, step: int) -> bool:
  """Whether a run resumed from the checkpoint at `step` writes `row` again: training
  rows of steps >= `step`, evaluations (keys under eval/) after it."""
  if any(key.startswith("eval/") for key in row):
    return row["step"] > step
  return row["step"] >= step


def write_jsonl(path, rows: Iterable[Mapping]) -> None:
  """One JSON object per line, written whole (`storage.write_atomic`: on local disk a
  temporary file renamed, in a bucket one object): a reader (or a crash) sees the old
  file or the new one, never half of one."""
  storage.write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8"))


def _rows(path) -> list[dict]:
  """The rows of a metrics file, without a last line torn by a crash mid-write."""
  lines = path.read_text(encoding="utf-8").split("\n")
  rows = []
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      if number < len(lines):  # only the unterminated last line can be torn
        raise ValueError(f"{path}:{number}: not a JSON metrics row; the file was edited or "
                         "damaged: remove that line.") from None
  return rows


def read_metrics(run_dir: str | pathlib.Path) -> list[dict]:
  """The rows of `run_dir`'s metrics.jsonl (a local directory or a bucket URL)."""
  path = storage.as_path(run_dir) / METRICS_FILE
  if not path.is_file():
    raise FileNotFoundError(f"{path} does not exist: is {run_dir} a sao-train run directory?")
  return _rows(path)


def curve_points(rows: list[dict], key: str, x: str = "step") -> np.ndarray:
  """`[2, n]` (x, value) of `key`, one point per step (the last row written: a resumed
  run's rows replace replayed ones), in step order, against `x` ("step" or another
  key the rows carry, e.g. `time/elapsed_s`); rows without `x` are left out."""
  by_step = {r["step"]: (r[x], r[key]) for r in rows if key in r and x in r}
  points = [by_step[step] for step in sorted(by_step)]
  return np.array(points, dtype=float).T.reshape(2, len(points))


def _plot_reward(ax, points: np.ndarray) -> None:
  """Training reward, with its moving mean once there are 10 points."""
  steps, values = points
  ax.plot(steps, values, marker="." if len(values) < 50 else None, alpha=0.5)
  if len(values) >= 10:  # the trend through sampling noise
    window = max(len(values) // 10, 5)
    smooth = np.convolve(values, np.ones(window) / window, mode="valid")
    ax.plot(steps[window - 1:], smooth, label=f"mean of last {window}")
    ax.legend(loc="lower right")


def plot_curves(run_dir: str | pathlib.Path):
  """Draws reward (training) and eval accuracy against learner step, and training
  reward against elapsed seconds (`time/elapsed_s`, when the rows carry it: what a
  wall-clock comparison reads), to curves.png (in `run_dir`, a local directory or a
  bucket URL); returns its path."""
  import io

  import matplotlib

  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt

  rows = read_metrics(run_dir)
  by_time = curve_points(rows, "reward/mean", timing.ELAPSED_KEY)
  panels = 3 if by_time.shape[1] else 2
  fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.6))
  series = [("reward/mean", "training reward (batch mean, sampled)"),
            ("eval/accuracy", "held-out accuracy (greedy)")]
  sampled = sorted({r["step"]: r["eval/sampled_accuracy"] for r in rows
                    if "eval/sampled_accuracy" in r}.items())
  if sampled:  # beside the greedy one: what the policy earns as training samples it
    steps, values = np.array(sampled).T
    axes[1].plot(steps, values, marker=".", label="sampled (run.eval_temperature)")
    series[1] = ("eval/accuracy", "held-out accuracy (greedy and sampled)")
  for ax, (key, title) in zip(axes, series):
    points = curve_points(rows, key)
    if points.shape[1]:
      steps = points[0]
      if key == "reward/mean":
        _plot_reward(ax, points)
      else:
        ax.plot(*points, marker="." if len(steps) < 50 else None)
      if steps.min() < 0:  # SFT warm-start steps are logged before step 0
        ax.axvspan(steps.min(), 0, color="0.9")
        ax.text(steps.min(), ax.get_ylim()[1], " SFT", va="top")
    if key == "eval/accuracy" and sampled:
      ax.lines[-1].set_label("greedy")
      ax.legend(loc="lower right")
    ax.set_title(title)
    ax.set_xlabel("learner step (negative: SFT warm-start)")
    ax.grid(alpha=0.3)
  if panels == 3:
    _plot_reward(axes[2], by_time)
    axes[2].set_title("training reward against wall-clock time")
    axes[2].set_xlabel("seconds trained (time/elapsed_s)")
    axes[2].grid(alpha=0.3)
  fig.tight_layout()
  out = storage.as_path(run_dir) / PLOT_FILE
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=110)
  plt.close(fig)
  storage.write_atomic(out, png.getvalue())
  return out
