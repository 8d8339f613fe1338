"""Profiler traces on demand: `sao-train --profile STEPS`, `sao-sampler --profile STEPS`.

    steps = ProfileSteps.parse("5:8")              # learner steps 5, 6, 7
    profiler = LearnerProfiler(steps, run_dir, signal, log)
    profiler.at(steps_done)                         # at start-up and after each step

`--profile N` traces the N learner steps after this launch's first one (the first
compiles the step, and its trace would be mostly compilation); `--profile A:B`
traces steps A to B-1 as `metrics.jsonl` numbers them. The learner's trace
(`jax.profiler`) covers those steps' waits, compute (a `learner_step` span per step,
`StepTraceAnnotation`, so TensorBoard's profile plugin counts steps), logging and
publishing (`learner/<phase>` spans, `run.phases`), and is written to
RUN_DIR/profile/learner. While it runs, every sampler process of the run traces its
engine steps (an `engine_step` span each, `SamplerTrace`) to
RUN_DIR/profile/sampler/worker_<id>: the learner opens and closes the window through
`ProfileSignal`, whose events reach the samplers in their `WorkerSpec`; a sampler
traces at least one engine step, even when the learner's window closed before its
next step began.

`sao-sampler --profile N` (or `A:B`) traces engine steps of each of its workers the
same way, counted from 0 in each worker (`ProfileSignal.of_engine_steps`), to
RUN_DIR/profile/sampler/worker_<id> on its host.

Each trace is a TensorBoard profile run (`tensorboard --logdir RUN_DIR/profile`,
with the tensorboard-plugin-profile package) and holds the same events as
`<host>.trace.json.gz` and `perfetto_trace.json.gz` (open either in
https://ui.perfetto.dev). A trace of a few steps is megabytes; of hundreds, the
profiler's buffers and the run's memory suffer: keep windows short.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import re
from typing import Any, Callable, Iterator

from sao_jax import storage

PROFILE_DIR = "profile"
LEARNER_TRACE = "learner"
SAMPLER_TRACE = "sampler"
_SPEC = re.compile(r"(?:(\d+):)?(\d+)\Z")
# How long a stopping run waits for its sampler processes to exit when they may be
# writing a trace (a few steps' trace takes seconds to write on a busy CPU; without
# one, `SamplerSupervisor.stop`'s default).
SAMPLER_WRITE_S = 120.0


@dataclasses.dataclass(frozen=True)
class ProfileSteps:
  """Which learner steps to trace: `count` steps from `start` (`--profile A:B`), or
  from the one after this launch's first when `start` is None (`--profile N`)."""

  start: int | None
  count: int

  @classmethod
  def parse(cls, text: str, unit: str = "learner steps") -> ProfileSteps:
    """`N` or `A:B` (module docstring) of `unit`; ValueError naming the value otherwise."""
    match = _SPEC.match(text.strip())
    start = None if match is None or match[1] is None else int(match[1])
    stop = None if match is None else int(match[2])
    if stop is None or stop < 1 or (start is not None and start >= stop):
      raise ValueError(f"--profile {text!r}: expected N (the N {unit} after this launch's "
                       f"first, N >= 1) or A:B ({unit} A to B-1, A < B), e.g. "
                       "--profile 3 or --profile 5:8")
    return cls(start, stop if start is None else stop - start)

  def window(self, first_step: int) -> range:
    """The steps traced by a launch whose first step is `first_step`."""
    start = first_step + 1 if self.start is None else self.start
    return range(start, start + self.count)

  def check(self, total_steps: int) -> None:
    """ValueError when a window of absolute steps ends past `learner.steps`."""
    if self.start is not None and self.start + self.count > total_steps:
      raise ValueError(f"--profile {self.start}:{self.start + self.count} ends past "
                       f"learner.steps={total_steps}: trace steps below {total_steps}")


@dataclasses.dataclass(frozen=True)
class ProfileSignal:
  """The samplers' trace window, sent to each sampler process in its `WorkerSpec`.
  Under sao-train it is the learner's: `opened` is set when the learner starts
  tracing, `closed` when it stops (multiprocessing events of the samplers' start
  method, which carries them to each process when it is spawned). Under sao-sampler
  it is `engine_steps`, the engine steps of each worker to trace (counted from 0).
  `directory` is RUN_DIR/profile/sampler."""

  directory: str
  opened: Any = None
  closed: Any = None
  engine_steps: range | None = None

  @classmethod
  def make(cls, run_dir: str, context) -> ProfileSignal:
    """The window a learner opens and closes (sao-train)."""
    return cls(str(trace_root(run_dir) / SAMPLER_TRACE), context.Event(), context.Event())

  @classmethod
  def of_engine_steps(cls, run_dir: str, steps: ProfileSteps) -> ProfileSignal:
    """Each worker's engine steps of `steps` (sao-sampler --profile; the first compiles)."""
    return cls(str(trace_root(run_dir) / SAMPLER_TRACE), engine_steps=steps.window(0))

  def opens(self, engine_step: int) -> bool:
    """Whether a sampler starts tracing before `engine_step` (not tracing yet)."""
    if self.engine_steps is not None:
      return engine_step == self.engine_steps.start
    return self.opened.is_set()

  def closes(self, engine_steps_done: int) -> bool:
    """Whether a sampler tracing stops once `engine_steps_done` steps are done."""
    if self.engine_steps is not None:
      return engine_steps_done >= self.engine_steps.stop
    return self.closed.is_set()


def trace_root(run_dir: str) -> pathlib.Path:
  """RUN_DIR/profile, where the traces go; ValueError for a bucket run directory (the
  profiler writes local files)."""
  if storage.is_url(run_dir):
    raise ValueError(f"--profile writes its traces into the run directory, and "
                     f"run.run_dir={run_dir!r} is a bucket; set run.run_dir to a local "
                     "directory (checkpoint.directory may stay in the bucket)")
  return pathlib.Path(run_dir) / PROFILE_DIR


def _start(directory: pathlib.Path) -> None:
  import jax  # pylint: disable=import-outside-toplevel

  directory.mkdir(parents=True, exist_ok=True)
  jax.profiler.start_trace(str(directory), create_perfetto_trace=True)


def _stop() -> None:
  import jax  # pylint: disable=import-outside-toplevel

  jax.profiler.stop_trace()


class LearnerProfiler:
  """Traces the learner steps of `steps` (module docstring) and opens and closes the
  samplers' window (`signal`; None: no sampler process to tell)."""

  def __init__(self, steps: ProfileSteps, run_dir: str, signal: ProfileSignal | None,
               log: Callable[[str], None] = print):
    self._steps, self._signal, self._log = steps, signal, log
    self._directory = trace_root(run_dir) / LEARNER_TRACE
    self._window: range | None = None
    self.tracing = False

  def at(self, steps_done: int) -> None:
    """Called once before the first step (`steps_done` = the first step) and after each
    step: starts the trace before the window's first step, stops it after its last."""
    if self._window is None:
      self._window = self._steps.window(steps_done)
      if steps_done > self._window.start:
        self._log(f"--profile: the window from step {self._window.start} began before this "
                  f"launch's first step, {steps_done}; nothing is traced")
    if steps_done == self._window.start and not self.tracing:
      _start(self._directory)
      self.tracing = True
      if self._signal is not None:
        self._signal.opened.set()
    elif steps_done == self._window.stop and self.tracing:
      self.close()

  def close(self) -> None:
    """Stops a trace under way (the run ended inside the window) and says where it is."""
    if not self.tracing:
      return
    _stop()
    self.tracing = False
    if self._signal is not None:
      self._signal.closed.set()
    where, first, last = self._directory.parent, self._window.start, self._window.stop - 1
    steps = f"step {first}" if first == last else f"steps {first}..{last}"
    self._log(f"profile: learner {steps} traced "
              f"to {self._directory}, the samplers' engine steps to {where / SAMPLER_TRACE}; "
              f"view with tensorboard --logdir {where} or load a perfetto_trace.json.gz "
              "in https://ui.perfetto.dev")


class SamplerTrace:
  """A sampler process's side of the window (`ProfileSignal`; None: never traces).
    with trace.engine_step(): runner.step()
  marks each engine step (`engine_step`, numbered) and starts or stops the trace
  around it as the learner's window opens and closes."""

  def __init__(self, signal: ProfileSignal | None, worker_id: int):
    self._signal = signal
    self._directory = (None if signal is None else
                       pathlib.Path(signal.directory) / f"worker_{worker_id}")
    self._steps = 0
    self._done = False  # a process traces one window
    self.tracing = False

  @contextlib.contextmanager
  def engine_step(self) -> Iterator[None]:
    import jax  # pylint: disable=import-outside-toplevel

    if (self._signal is not None and not self._done and not self.tracing
        and self._signal.opens(self._steps)):
      _start(self._directory)
      self.tracing = True
    with jax.profiler.StepTraceAnnotation("engine_step", step_num=self._steps):
      yield
    self._steps += 1
    if self.tracing and self._signal.closes(self._steps):  # after one engine step at least
      self.close()

  def close(self) -> None:
    """Stops a trace under way (the window closed, or the sampler is stopping)."""
    if self.tracing:
      _stop()
      self.tracing, self._done = False, True
