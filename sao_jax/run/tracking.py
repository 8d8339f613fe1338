"""Weights & Biases logging of a run's metrics rows (`run.loggers` with "wandb").

    logger = WandbLogger(run_dir, project="sao-jax", name=cfg.name, config=asdict(cfg))
    logger.write(step, {"reward/mean": 0.4})
    logger.close()

Each row is logged with its learner step as the `learner_step` metric, which
every other metric is plotted against (W&B's own step must only grow, and SFT
warm-start rows have negative steps). Files go to `run_dir/wandb` (W&B's default
directory for a bucket run directory, `sao_jax.storage`); where the
run goes (online, `WANDB_MODE=offline`, entity, API key) is W&B's own
environment variables. W&B cannot delete logged rows, so a resumed run
(`MetricsLogger.rewind`) is a new W&B run that logs the replayed steps again;
metrics.jsonl and TensorBoard keep each step once.
"""

from __future__ import annotations

import pathlib
from typing import Mapping

STEP_METRIC = "learner_step"


class WandbLogger:

  def __init__(self, run_dir: str | pathlib.Path | None, *, project: str, name: str,
               config: dict):
    """`run_dir`: where W&B keeps its local files (None: its default directory, WANDB_DIR
    or ./wandb; a bucket run directory's logger passes None)."""
    try:
      import wandb
    except ImportError:
      raise ValueError("run.loggers includes 'wandb' but the wandb package is not installed: "
                       "pip install 'sao-jax[wandb]' (wandb==0.31.0), or remove 'wandb' from "
                       "run.loggers") from None
    self._run = wandb.init(project=project, name=name,
                           dir=None if run_dir is None else str(run_dir), config=config,
                           reinit="create_new")
    self._run.define_metric(STEP_METRIC)
    self._run.define_metric("*", step_metric=STEP_METRIC)

  @property
  def run(self):
    return self._run

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    self._run.log({STEP_METRIC: step, **metrics})

  def close(self) -> None:
    self._run.finish()
