"""`sao-train` end to end on CPU: sampler process, learner, outputs, crash-restart, resume
(from a damaged newest checkpoint, with each step logged once)."""

import functools
import json
import math
import os
import pathlib
import re
import signal

import psutil
import pytest

from sao_jax.cli import evaluate as evaluate_cli
from sao_jax.cli import train as train_cli
from profile_traces import spans, trace_events
from sao_jax.config import load_config
from sao_jax.data.sampler_phases import SAMPLER_PHASES
from sao_jax.run import phases
from tiny_run import TINY_RUN as TINY

ROOT = pathlib.Path(__file__).resolve().parents[2]


def sampler_processes():
  return [p for p in psutil.Process().children(recursive=True)
          if any("spawn_main" in part for part in p.cmdline())
          and not any("resource_tracker" in part for part in p.cmdline())]


def _task_positions(run_dir, step):
  """The task positions saved in checkpoint `step`'s data-pipeline state."""
  state = json.loads((run_dir / "checkpoints" / str(step) / "data" / "metadata").read_text())
  while "task_positions" not in state:
    state = state["parent"]
  return state["task_positions"]


def test_train_kill_sampler_then_resume(tmp_path, capsys, monkeypatch):
  from sao_jax.run import bootstrap
  # The run trains its own tokenizer and writes the copy samplers and sao-eval load,
  # as a real run does, on 50 demonstration transcripts instead of 400: each is a
  # played episode with a sandboxed tool run, and nothing here depends on the merges.
  monkeypatch.setattr(bootstrap, "train_run_tokenizer",
                      functools.partial(bootstrap.train_run_tokenizer, transcripts=50))
  run_dir = tmp_path / "run"
  overrides = TINY + [f"run.run_dir={run_dir}", "learner.steps=3"]
  killed = []

  def log(line):
    print(line, flush=True)
    if line.startswith("step 1/") and not killed:  # SIGKILL the sampler mid-run
      for process in sampler_processes():
        os.kill(process.pid, signal.SIGKILL)
        killed.append(process.pid)

  from sao_jax.jobs import train
  cfg = load_config(ROOT / "configs" / "demo_cpu.py", overrides)
  summary = train.run(cfg, log=log)
  assert killed, "no sampler process was running at step 1"
  assert summary["steps_done"] == 3 and summary["sampler_restarts"] >= 1
  assert not sampler_processes(), "samplers outlived the learner"
  out = capsys.readouterr().out
  assert "sampler 0 died" in out and "eval @ step 0" in out
  rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  steps = [r["step"] for r in rows if "reward/mean" in r]
  assert steps == [0, 1, 2]
  assert any("eval/accuracy" in r for r in rows) and any("sft/loss" in r for r in rows)
  # The first and the last training batch's first episodes, as text (#49 item 9).
  for step in (0, 2):
    episodes = [json.loads(l) for l in
                (run_dir / "transcripts" / f"train_step_{step}.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and all(e["step"] == step and e["text"] for e in episodes)
  assert sorted(p.name for p in (run_dir / "transcripts").iterdir()) == [
      "train_step_0.jsonl", "train_step_2.jsonl"]
  # Every key a real run logs is in the metrics reference (sao_jax/run/metric_docs.py).
  from sao_jax.run import metric_docs
  undocumented = {k for r in rows for k in r if k not in ("step", "time")
                  and metric_docs.describe(k) is None}
  assert not undocumented, f"add to sao_jax/run/metric_docs.py: {sorted(undocumented)}"
  assert all(r["staleness/max"] <= cfg.data.max_lag for r in rows if "staleness/max" in r)
  # The critic's quality pooled over the steps so far, in the file and the progress line.
  train_rows = [r for r in rows if "reward/mean" in r]
  assert all("value/explained_variance_window" in r and "value/bias_window" in r
             for r in train_rows)
  assert " | critic EV " in out
  assert (run_dir / "curves.png").stat().st_size > 0
  assert list((run_dir / "tensorboard").iterdir())
  transcripts = (run_dir / "eval" / "episodes_step_2.jsonl").read_text().splitlines()
  assert len(transcripts) == cfg.run.eval_episodes  # fewer than run.eval_transcripts
  saved = {int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()}
  assert {2, 3} <= saved and max(saved) == 3  # every 2 steps, and the final step
  # The checkpoint keeps where sampler 0's task stream stands (data.task_positions),
  # after the tasks that reached the learner, its restart included.
  reached = _task_positions(run_dir, 2)["0"][0]
  assert reached >= cfg.learner.batch_trajectories

  # Without --resume the CLI refuses to overwrite; with it, training continues. The newest
  # checkpoint (step 3) is damaged, so it resumes from step 2 and trains step 2 again.
  args = ["--config", str(ROOT / "configs" / "demo_cpu.py")]
  args += [a for o in TINY + [f"run.run_dir={run_dir}", "learner.steps=5"] for a in ("--set", o)]
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(args)
  assert exit_info.value.code == 2 and "--resume" in capsys.readouterr().err
  for path in (run_dir / "checkpoints" / "3" / "state").rglob("*"):
    if path.is_file() and path.parent.name == "d":  # truncated, as by a full disk
      path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
  # --profile (#55 item 5): step 3 traced, and the sampler's engine steps meanwhile.
  train_cli.main(args + ["--resume", "--profile", "3:4"])
  out = capsys.readouterr().out
  assert "checkpoints/3 does not restore" in out and "resuming from step 2" in out
  assert f"profile: learner step 3 traced to {run_dir / 'profile' / 'learner'}" in out
  assert spans(trace_events(run_dir / "profile" / "learner"), "learner_step") == [3]
  assert spans(trace_events(run_dir / "profile" / "sampler" / "worker_0"), "engine_step")
  assert list((run_dir / "checkpoints").glob("corrupt-3-*"))
  assert "step 3/5" in out and "step 1/5" not in out and "done: 5 steps" in out
  assert not sampler_processes()
  # The replayed step 2 replaced the interrupted run's row: each step once, everywhere.
  rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "reward/mean" in r] == [0, 1, 2, 3, 4]
  # Where each step's time went (run.phases): the learner's phases add up to the step
  # within the stated tolerance, the samplers' to their wall time; both in the progress line.
  for row in (r for r in rows if "reward/mean" in r):
    total, wall = phases.accounted(row)
    assert wall - phases.TOLERANCE_S - phases.TOLERANCE_FRAC * wall <= total <= wall + 1e-9
    assert row[phases.SAMPLER_WALL_KEY] > 0 and math.isclose(
        sum(row[phases.sampler_key(p)] for p in SAMPLER_PHASES), row[phases.SAMPLER_WALL_KEY],
        rel_tol=1e-9, abs_tol=1e-9)
  assert re.search(r"\| [\d.]+ s/step \(\w+ \d+%, .*\) \| sampler \w+ \d+%", out)
  # The wall clock goes on across the resume (from the last row kept), as do the
  # trajectories consumed.
  clock = [(r["time/elapsed_s"], r["data/trajectories_total"]) for r in rows if "reward/mean" in r]
  assert clock == sorted(clock) and clock[0][0] > 0
  assert [b - a for (_, a), (_, b) in zip(clock, clock[1:])] == [
      float(cfg.learner.batch_trajectories)] * 4
  assert [r["step"] for r in rows if "eval/accuracy" in r] == [-2, 0, 2, 4]  # -2: before SFT
  [events] = (run_dir / "tensorboard").iterdir()  # rebuilt from the rows kept
  assert ".resumed-at-2." in events.name
  assert _task_positions(run_dir, 5)["0"][0] > reached  # the resumed stream went on

  # sao-eval restores the latest checkpoint's policy, evaluates it, prints a table and
  # writes the JSON report.
  evaluate_cli.main(args + ["--episodes", "2"])
  out = capsys.readouterr().out
  report = json.loads((run_dir / "eval" / "step_5.json").read_text())
  assert report["step"] == 5 and report["overall"]["tasks"] == 2
  assert 0.0 <= report["overall"]["greedy_pass@1"] <= 1.0
  assert "greedy_pass@1" in out and f"report: {run_dir / 'eval' / 'step_5.json'}" in out


@pytest.mark.slow  # a second compiled run; the hang it guards against needs a whole learner
def test_a_sampler_that_dies_before_the_first_step_is_restarted(tmp_path, monkeypatch):
  """The learner restarts samplers while it waits for trajectories, not only after
  a step: before, a sampler that died on start-up left the learner waiting forever."""
  import dying_sampler
  from sao_jax.jobs import train
  from sao_jax.sampler.worker import SamplerSupervisor

  monkeypatch.setenv("SAO_TEST_DIED_ONCE", str(tmp_path / "died"))
  monkeypatch.setattr(train, "SamplerSupervisor",
                      functools.partial(SamplerSupervisor, run=dying_sampler.die_once))

  def hung(*_):
    raise TimeoutError("the learner waited 240 s for trajectories from a dead sampler")

  previous = signal.signal(signal.SIGALRM, hung)
  signal.alarm(240)
  try:
    cfg = load_config(ROOT / "configs" / "demo_cpu.py", TINY + [
        f"run.run_dir={tmp_path / 'run'}", "learner.steps=1", "run.sft_steps=0",
        "run.eval_every=0"])
    summary = train.run(cfg, log=print)
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
  assert (tmp_path / "died").exists()
  assert summary["steps_done"] == 1 and summary["sampler_restarts"] == 1
