"""A reward function that fails on every episode ends `sao-train` with exit 2 and its error
text (each failure kind, its count and first message), within a bounded time; before, the
learner printed nothing (drop reasons reached the log only after a step) and waited forever."""

import json
import pathlib
import time

import pytest

from sao_jax.cli import train as train_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
SANITY = str(ROOT / "configs" / "sanity_cpu.py")
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.head_dim=8",
        "learner.batch_trajectories=8", "run.sft_steps=0", "run.eval_every=0"]


def test_a_reward_function_that_always_fails_stops_the_run_naming_its_error(
    tmp_path, monkeypatch, capsys):
  # As verl's gsm8k reward does when called with an argument it does not expect.
  (tmp_path / "failing_reward.py").write_text(
      "def score(response, task, messages):\n"
      "  method = 'exact'\n"
      "  assert method in ['strict', 'flexible'], f'method {method!r} unknown'\n")
  monkeypatch.syspath_prepend(str(tmp_path))  # the spawned sampler inherits sys.path
  run_dir = tmp_path / "run"
  started = time.monotonic()
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", SANITY, *sum((["--set", item] for item in TINY + [
        f"run.run_dir={run_dir}", "env.reward_fn=failing_reward:score",
        "run.failure_window=8", "run.waiting_report_s=0.5"]), [])])
  elapsed = time.monotonic() - started
  out, err = capsys.readouterr()
  assert exit_info.value.code == 2 and elapsed < 240, (exit_info.value.code, elapsed)
  assert "8 of the last 8 episodes the learner received failed" in err, err
  assert "run.max_failure_fraction=0.95" in err and "raise run.max_failure_fraction" in err
  # Each kind with its count and first message (the reward function's own text).
  assert "env_failure/env_declared 8 (first: " in err or "env_failure/AssertionError 8" in err
  assert "method 'exact' unknown" in err
  # While no step completed, the learner said what it waited for and what it dropped.
  assert "waiting for trajectories for step 1 (0 steps done" in out, out
  assert "1 of 1 sampler processes alive" in out
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["stopped_by"] == "too_many_failures" and summary["trajectories_admitted"] == 0
  assert sum(summary["dropped_by_kind"].values()) >= 8
  assert all("method 'exact' unknown" in text for text in summary["dropped_first_message"].values())
