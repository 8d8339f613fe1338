"""PNG figures for the report (matplotlib, Agg): curves with 95% CI bands across seeds.

Every curve is first smoothed per seed (reward: trailing mean; diagnostics:
trailing median, robust to single-step outliers), then averaged across seeds at
each step; the band is the t-interval of that mean (none for 1 seed).
"""

from __future__ import annotations

import pathlib
from typing import Mapping, Sequence

import matplotlib
import numpy as np

from experiments import stats
from experiments.runs import Run

matplotlib.use("Agg")  # files only, no display; pyplot is imported after this
import matplotlib.pyplot as plt  # noqa: E402

STABILITY_METRICS = (("policy/kl_k3", "KL to behavior (k3)"), ("policy/entropy", "entropy"),
                     ("policy/grad_norm", "policy grad norm"),
                     ("value/grad_norm", "value grad norm"),
                     ("policy/mask_low_frac", "DIS masked below band"),
                     ("policy/mask_high_frac", "DIS masked above band"),
                     ("policy/clip_frac", "PPO clip fraction"),
                     ("value/explained_variance", "value explained variance"))


def _aligned(runs: Sequence[Run], values: Sequence[np.ndarray], steps: Sequence[np.ndarray]):
  """[seeds, common steps] matrix over the steps every run has."""
  common = sorted(set.intersection(*(set(s.tolist()) for s in steps)))
  matrix = np.array([[v[np.searchsorted(s, c)] for c in common] for v, s in zip(values, steps)])
  return np.array(common), matrix


def _colors(labels) -> dict[str, str]:
  """One color per variant in every panel, even where a variant lacks a metric."""
  return {label: f"C{i}" for i, label in enumerate(labels)}


def _band(ax, label: str, steps: np.ndarray, matrix: np.ndarray, color: str) -> None:
  mean, half = stats.band(matrix)
  ax.plot(steps, mean, label=f"{label} (n={matrix.shape[0]})", color=color)
  if matrix.shape[0] > 1:
    ax.fill_between(steps, mean - half, mean + half, color=color, alpha=0.2)


def _plottable(runs: Sequence[Run], key: str | None) -> list[Run]:
  """The runs with steps and, for a diagnostic `key`, that metric."""
  return [r for r in runs if r.steps.size and (key is None or key in r.metrics)]


def _smoothed(run: Run, key: str | None, window: int) -> np.ndarray:
  """Reward (`key` None): trailing mean; a diagnostic: trailing median (robust to spikes)."""
  return (stats.trailing_mean(run.reward, window) if key is None else
          stats.trailing_median(run.metrics[key], window))


def _curve(ax, label: str, runs: Sequence[Run], key: str | None, window: int,
           color: str) -> None:
  """Reward or a diagnostic (`_smoothed`), mean with its band across runs."""
  usable = _plottable(runs, key)
  if not usable:
    return
  values = [_smoothed(r, key, window) for r in usable]
  _band(ax, label, *_aligned(usable, values, [r.steps for r in usable]), color)


def _finish(fig, path: pathlib.Path, *, layout: bool = True) -> pathlib.Path:
  if layout:  # False: the caller laid the figure out (room for a figure legend)
    fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def learning_curves(groups: Mapping[str, Sequence[Run]], path: pathlib.Path, *,
                    window: int) -> pathlib.Path:
  """Training reward and held-out accuracy gain per variant, mean ± 95% CI across seeds.

  The gain is each run's accuracy minus its step-0 accuracy: all variants of a
  seed start from one warm-start, whose level varies a lot between seeds, so
  the gain shows the differences that raw accuracy bands would hide.
  """
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
  colors = _colors(groups)
  for label, runs in groups.items():
    _curve(left, label, runs, None, window, colors[label])
    usable = [r for r in runs if r.eval_steps.size]
    if usable:
      _band(right, label, *_aligned(usable, [r.eval_accuracy - r.accuracy_at(0) for r in usable],
                                    [r.eval_steps for r in usable]), colors[label])
  left.set_title(f"training reward (trailing mean of {window} steps)")
  right.set_title("held-out accuracy (greedy) minus its step-0 value")
  for ax in (left, right):
    ax.set_xlabel("learner step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  return _finish(fig, path)


def realignment(groups: Mapping[str, Sequence[Run]], path: pathlib.Path, *,
                switches: Sequence[int], recovery: Mapping[str, Sequence[str]],
                window: int) -> pathlib.Path:
  """Reward around each preference switch; `recovery[label][i]` annotates switch i."""
  fig, ax = plt.subplots(figsize=(11, 4))
  colors = _colors(groups)
  for label, runs in groups.items():
    _curve(ax, label, runs, None, window, colors[label])
  top = ax.get_ylim()[1]
  for i, switch in enumerate(switches):
    ax.axvline(switch, color="0.3", linestyle="--", linewidth=1)
    text = "\n".join(f"{label}: {recovery[label][i]}" for label in groups)
    ax.text(switch, top, f" switch @ {switch}\n steps to 90%:\n{text}", va="top", fontsize=7)
  ax.set_title(f"reward around preference switches (trailing mean of {window} steps)")
  ax.set_xlabel("learner step")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc="lower right")
  return _finish(fig, path)


SEED_STYLES = ("-", "--", ":", "-.")


def _per_run(ax, label: str, runs: Sequence[Run], key: str | None, window: int,
             color: str) -> None:
  """Reward or a diagnostic (`_smoothed`), one line per run (seed: line style)."""
  for i, run in enumerate(_plottable(runs, key)):
    ax.plot(run.steps, _smoothed(run, key, window), color=color,
            linestyle=SEED_STYLES[i % len(SEED_STYLES)], linewidth=1,
            label=f"{label} seed {run.seed}")


def stability(groups: Mapping[str, Sequence[Run]], path: pathlib.Path, *,
              window: int) -> pathlib.Path:
  """Reward and the stability diagnostics, one panel each, one line per run: a
  collapse happens to a run, and seeds that start at very different levels would
  hide it inside a mean and its band."""
  panels = (("reward", None), *((title, key) for key, title in STABILITY_METRICS))
  fig, axes = plt.subplots(3, 3, figsize=(13, 9))
  colors = _colors(groups)
  for ax, (title, key) in zip(axes.flat, panels):
    for label, runs in groups.items():
      _per_run(ax, label, runs, key, window, colors[label])
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("learner step", fontsize=8)
    ax.grid(alpha=0.3)
  # One legend for the figure, below the panels: a legend per panel of 8 seeds x 2
  # variants covered the lines it names.
  handles, labels = axes.flat[0].get_legend_handles_labels()
  fig.tight_layout(rect=(0, 0.04 + 0.012 * -(-len(labels) // 4), 1, 1))
  fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
  return _finish(fig, path, layout=False)


def binned(run: Run, key: str, width: float, end: float) -> np.ndarray:
  """Mean reward over the run's steps in each `width`-wide bin of metric `key`
  (`time/elapsed_s`, `data/trajectories_total`) from 0 up to `end` (NaN for a bin
  without a step)."""
  x = run.metrics.get(key, np.full(run.steps.size, np.nan))
  edges = np.arange(0.0, end + width / 2, width)
  out = np.full(max(edges.size - 1, 0), np.nan)
  for i, (low, high) in enumerate(zip(edges[:-1], edges[1:])):
    inside = run.reward[(x > low) & (x <= high) & np.isfinite(run.reward)]
    if inside.size:
      out[i] = inside.mean()
  return out


def _binned_band(ax, label: str, runs: Sequence[Run], key: str, width: float,
                 color: str) -> None:
  """Mean ± 95% CI across runs of `binned` reward, over the whole bins every run filled."""
  usable = [r for r in runs if key in r.metrics and r.steps.size]
  if not usable:
    return
  end = min(float(np.nanmax(r.metrics[key])) for r in usable) // width * width
  matrix = np.array([binned(r, key, width, end) for r in usable])
  keep = np.all(np.isfinite(matrix), axis=0)
  if keep.any():
    _band(ax, label, ((np.arange(matrix.shape[1]) + 0.5) * width)[keep], matrix[:, keep], color)


def reward_against_time(groups: Mapping[str, Sequence[Run]], path: pathlib.Path, *,
                        bin_s: float, bin_trajectories: float = 64.0) -> pathlib.Path:
  """Training reward against wall-clock (left, `bin_s`-second bins) and against
  trajectories consumed (right, `bin_trajectories`-wide bins), per variant: each run's
  mean reward per bin, then the mean ± 95% CI across seeds over the whole bins every
  run reached."""
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
  colors = _colors(groups)
  for label, runs in groups.items():
    _binned_band(left, label, runs, "time/elapsed_s", bin_s, colors[label])
    _binned_band(right, label, runs, "data/trajectories_total", bin_trajectories,
                 colors[label])
  left.set_title(f"training reward against wall-clock ({bin_s:.0f} s bins)")
  left.set_xlabel("seconds since the learner asked for its first batch")
  right.set_title(f"training reward against trajectories consumed ({bin_trajectories:.0f} "
                  "a bin)")
  right.set_xlabel("trajectories consumed")
  for ax in (left, right):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  return _finish(fig, path)
