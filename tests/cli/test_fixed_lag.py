"""Reproducible rollouts (`data.fixed_lag`): one seed run twice, the second beside
processes that burn the CPU, gives the same tokens, rewards and final parameters.

The sanity setting (configs/sanity_cpu.py), shrunk: a short SFT warm-start so the
sampled reward is not 0, one critic warm-up step, then policy updates sampled one
version behind (L = 1: the sampler generates batch t + 1 while the learner trains t).
"""

import contextlib
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from sao_jax.config import load_config
from sao_jax.jobs import train
from sao_jax.jobs.evaluate import restore_items
from sao_jax.sharding.mesh import make_mesh

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL = ["learner.steps=6", "learner.batch_trajectories=8", "learner.critic_warmup_steps=1",
         "run.sft_steps=40", "run.sft_batch=8", "sampler.slots=4",
         "checkpoint.save_every_steps=100"]
# Metrics of the run's clock and of the learner's waiting, and every time/* key (the
# learner's and the samplers' phases, `run.phases`): they measure the machine.
TIMING = ("time", "learner/idle_frac", "learner/idle_frac_total", "learner/wait_s")


def timing(key: str) -> bool:
  return key in TIMING or key.startswith("time/")


@contextlib.contextmanager
def cpu_burners(count: int = 2):
  """`count` busy-loop processes at this process's priority, for the duration."""
  burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
  try:
    yield
  finally:
    for burner in burners:
      burner.kill()
      burner.wait()


def train_once(run_dir: pathlib.Path, *overrides: str):
  """(metrics rows less the timing keys, the train transcripts' text, final policy and
  value params as numpy) of a sanity run."""
  cfg = load_config(ROOT / "configs" / "sanity_cpu.py",
                    SMALL + [f"run.run_dir={run_dir}", *overrides])
  summary = train.run(cfg)
  assert summary["steps_done"] == cfg.learner.steps
  rows = [{k: v for k, v in json.loads(line).items() if not timing(k)}
          for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
  transcripts = {p.name: p.read_text() for p in sorted((run_dir / "transcripts").iterdir())}
  restored, meta = restore_items(cfg.with_run_paths(), ("policy_params", "value_params"), None,
                                 make_mesh(cfg.mesh))
  assert meta["step"] == cfg.learner.steps
  return rows, transcripts, jax.tree.map(np.asarray, jax.device_get(restored))


@pytest.mark.slow
def test_one_seed_gives_the_same_run_on_a_quiet_and_a_loaded_machine(tmp_path):
  quiet = train_once(tmp_path / "quiet", "data.fixed_lag=1")
  with cpu_burners():
    loaded = train_once(tmp_path / "loaded", "data.fixed_lag=1")
  rows, transcripts, params = quiet
  assert [r["step"] for r in rows if r["step"] >= 0] == list(range(6))
  rewards = [r["reward/mean"] for r in rows if r["step"] >= 0]
  assert any(rewards), rewards  # the episodes score, so equal rewards say something
  # Batch t is sampled entirely by the policy after t - 1 steps: every trajectory of a
  # batch has the same lag, 0 before the first policy update was published, then 1, and
  # no trajectory was sampled by two versions.
  rl = [r for r in rows if r["step"] >= 0]
  assert [(r["staleness/mean"], r["staleness/max"]) for r in rl] == [(0, 0), (0, 0)] + [(1, 1)] * 4
  assert all(r["staleness/multi_version_frac"] == 0 for r in rl)
  # Rewards, losses, lengths, every sampled-token statistic (as text: NaN equals NaN).
  assert json.dumps(loaded[0]) == json.dumps(rows)
  assert loaded[1] == transcripts and transcripts  # the first and the last batch's text
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(params),
                          jax.tree.leaves(loaded[2])):
    assert np.array_equal(a, b), f"{jax.tree_util.keystr(path)} differs"
