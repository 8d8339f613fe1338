"""`sao-train --profile` (`sao_jax.run.profile`): which steps a window holds, and the traces
the learner and a sampler write, opened and searched for their step spans."""

import pathlib
import threading

import jax
import jax.numpy as jnp
import pytest

from profile_traces import spans, trace_events
from sao_jax.cli import sampler as sampler_cli
from sao_jax.cli import train as train_cli
from sao_jax.run.profile import (LearnerProfiler, ProfileSignal, ProfileSteps, SamplerTrace,
                                 PROFILE_DIR, LEARNER_TRACE, SAMPLER_TRACE)


def test_a_window_is_n_steps_after_the_first_or_the_steps_named():
  assert ProfileSteps.parse("3").window(0) == range(1, 4)
  assert ProfileSteps.parse("3").window(10) == range(11, 14)  # a resumed launch
  assert ProfileSteps.parse(" 5:8").window(0) == range(5, 8)
  for bad in ("0", "8:5", "5:5", "-1", "1:2:3", "x"):
    with pytest.raises(ValueError, match=rf"--profile '{bad}': expected N .* or A:B"):
      ProfileSteps.parse(bad)
  ProfileSteps.parse("5:8").check(total_steps=8)
  with pytest.raises(ValueError, match="--profile 5:9 ends past learner.steps=8"):
    ProfileSteps.parse("5:9").check(total_steps=8)


def test_the_cli_refuses_a_bad_window_before_starting(capsys):
  root = pathlib.Path(__file__).resolve().parents[1]
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", str(root / "configs" / "tiny_cpu.py"), "--set",
                    "learner.steps=4", "--profile", "2:9", "--check"])
  assert exit_info.value.code == 2
  assert "--profile 2:9 ends past learner.steps=4" in capsys.readouterr().err


def test_the_learner_traces_its_window_and_opens_the_samplers(tmp_path):
  step = jax.jit(lambda x: jnp.tanh(x @ x))
  x = jnp.ones((64, 64))
  signal = ProfileSignal(str(tmp_path / PROFILE_DIR / SAMPLER_TRACE), threading.Event(),
                         threading.Event())
  lines = []
  profiler = LearnerProfiler(ProfileSteps.parse("1:3"), str(tmp_path), signal, lines.append)
  profiler.at(0)  # start-up: the window has not begun
  for steps_done in range(1, 5):
    with jax.profiler.StepTraceAnnotation("learner_step", step_num=steps_done - 1):
      x = step(x).block_until_ready()
    profiler.at(steps_done)
    assert signal.opened.is_set() == (steps_done >= 1)
    assert signal.closed.is_set() == (steps_done >= 3)
  events = trace_events(tmp_path / PROFILE_DIR / LEARNER_TRACE)
  assert spans(events, "learner_step") == [1, 2]  # steps 1 and 2, not 0 or 3
  assert "learner steps 1..2 traced to" in lines[-1]


def test_a_sampler_traces_at_least_one_engine_step_of_the_window(tmp_path):
  signal = ProfileSignal(str(tmp_path), threading.Event(), threading.Event())
  trace = SamplerTrace(signal, worker_id=3)
  with trace.engine_step():  # before the window: not traced
    pass
  signal.opened.set()
  signal.closed.set()  # the learner's window closed before the sampler's next step
  for _ in range(3):
    with trace.engine_step():
      jnp.ones(8).block_until_ready()
  assert not trace.tracing
  assert spans(trace_events(tmp_path / "worker_3"), "engine_step") == [1]


def test_sao_sampler_traces_the_engine_steps_it_is_told(tmp_path):
  window = ProfileSignal.of_engine_steps(str(tmp_path), ProfileSteps.parse("2", "engine steps"))
  assert window.directory == str(tmp_path / PROFILE_DIR / SAMPLER_TRACE)
  trace = SamplerTrace(window, worker_id=0)
  for _ in range(5):
    with trace.engine_step():
      jnp.ones(8).block_until_ready()
  # Steps 1 and 2: the two after the first, which compiles.
  assert spans(trace_events(tmp_path / PROFILE_DIR / SAMPLER_TRACE / "worker_0"),
               "engine_step") == [1, 2]


def test_traces_are_refused_for_a_bucket_run_directory_and_bad_windows(capsys):
  with pytest.raises(ValueError, match="run.run_dir='gs://b/run' is a bucket"):
    ProfileSignal.of_engine_steps("gs://b/run", ProfileSteps.parse("2"))
  root = pathlib.Path(__file__).resolve().parents[1]
  with pytest.raises(SystemExit) as exit_info:
    sampler_cli.main(["--config", str(root / "configs" / "tiny_cpu.py"), "--profile", "3:3"])
  assert exit_info.value.code == 2
  assert "--profile '3:3': expected N (the N engine steps after" in capsys.readouterr().err
