"""The learner loop: batches in, steps, checkpoints, resumption, preemption.

    result = run_learner(cfg, batches, on_metrics=print_fn, after_step=publish_fn)

`batches` is any iterator of host `Batch`es of shape `[learner.batch_rows, T]`,
or of `(Batch, host_metrics)` pairs whose dict joins that step's metrics (the
data pipeline's staleness and drop counts). T may vary between batches (length
buckets): the step is compiled once per distinct T. If the iterator has
`get_state() -> dict` / `set_state(dict)` (grain iterators do), its state is
checkpointed with the train state, so a resumed run sees exactly the batches an
uninterrupted run would. Step N's metrics are fetched after step N+1 has been
dispatched, so the host never stalls the device waiting for them.

Multi-host (`jax.process_count() > 1`): every host's iterator yields only its own
rows of the batch (`learner.batch_rows / process_count`), assembled into the
global batch by `distributed.global_batch`; before each step the hosts agree on
the padded length, and they stop together when any host runs out of data
(`distributed.agree_on_batch`) or is preempted (`distributed.any_host`).

On SIGTERM the loop finishes the step in flight, writes a checkpoint and
returns with `stopped_by="preemption"`; rerunning the same command resumes. A
SIGTERM that lands while the loop waits for a batch ends the wait too, when the
batches watch the same flag (`watcher`; the data pipeline's `interrupted`): the
pipeline raises `data.pipeline.Interrupted` with what it had gathered kept in its
state, and the loop checkpoints the last finished step with it (when that step's
checkpoint was written already, what arrived since is not kept, as after a crash).
Agent episodes can run for minutes, and a preempted TPU VM has seconds.
With `run.max_wall_s` > 0 the loop stops the same way once the run has trained
that many seconds (`sao_jax.run.timing.RunClock`, resumes included), after the
step in flight, with a final checkpoint: `stopped_by="wall_clock"`. Every step's
host metrics carry the clock's: elapsed seconds, trajectories consumed, and the
learner's idle share (the time `next(batches)` blocked).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Protocol

import jax

from sao_jax.config import Config
from sao_jax.data.pipeline import Interrupted
from sao_jax.learner import compile as compile_lib
from sao_jax.learner.state import TrainState, abstract_state, checkpointed, with_frozen_parts
from sao_jax.learner.step import update_policy_at
from sao_jax.run.checkpoint import Checkpointer, PreemptionWatcher
from sao_jax.run.phases import StepPhases
from sao_jax.run.timing import BATCH_TRAJECTORIES_KEY, RunClock
from sao_jax.sharding import distributed
from sao_jax.sharding.mesh import make_mesh
from sao_jax.types import Batch


class BatchIterator(Protocol):
  def __next__(self) -> Batch: ...


@dataclasses.dataclass
class LearnerResult:
  state: TrainState
  steps_done: int
  stopped_by: str  # "steps" | "preemption" | "wall_clock" | "data_exhausted"


def _data_state(batches: Any) -> dict:
  return batches.get_state() if hasattr(batches, "get_state") else {}


def run_learner(cfg: Config, batches: Iterator[Batch | tuple[Batch, dict]], *,
                on_metrics: Callable[[int, dict[str, float]], None] = lambda step, m: None,
                after_step: Callable[[int, TrainState], None] = lambda step, state: None,
                on_start: Callable[[TrainState, bool], None] = lambda state, resumed: None,
                mesh: jax.sharding.Mesh | None = None, resume: bool = True,
                initial_state: Callable[[jax.sharding.Mesh], TrainState] | None = None,
                base_state: Callable[[jax.sharding.Mesh], TrainState] | None = None,
                clock: Callable[[], RunClock] = RunClock,
                phases: StepPhases | None = None,
                watcher: PreemptionWatcher | None = None,
                log: Callable[[str], None] = print) -> LearnerResult:
  """Trains until `cfg.learner.steps` steps are done, the data ends, SIGTERM, or
  `run.max_wall_s` seconds have passed on `clock()` (made after `on_start`; a
  resumed run passes one that carries its elapsed time over).

  `initial_state(mesh)` builds the state of a fresh run (default: random init
  from `cfg.seed`); it is not called when resuming from a checkpoint. With LoRA
  checkpoints leave the frozen base out (`state.checkpointed`); a resume takes it
  from `base_state(mesh)`, a step-0 state around the base (default: `initial_state`).
  `on_start(state, resumed)` runs once before the first step (e.g. to publish
  the first weights and start samplers); `after_step(steps_done, state)` after
  each dispatched step (e.g. to publish weights or evaluate). Resuming takes the
  newest checkpoint that restores (`Checkpointer.restore`, which reports damaged
  ones through `log`). Every step's metrics reach `on_metrics` before a
  checkpoint after that step is saved, so a resumed run at step s owes exactly
  the metrics of steps s, s+1, ...

  Each step's row carries where its time went (`run.phases`): `phases` times the
  wait, compute, logging and checkpoint phases here, and the caller's `after_step`
  may time its own (publish, evaluation) with the same object. The loop waits for
  each step's result before `after_step` (a publish reads it anyway), so compute ends
  where the step does.

  `watcher` is the SIGTERM flag when the caller made it (so that `batches` can stop
  waiting on it, raising `Interrupted`); the caller closes it. Else the loop makes its
  own for the steps.
  """
  mesh = make_mesh(cfg.mesh) if mesh is None else mesh
  compiled: dict[int, tuple[Callable, Batch]] = {}  # per padded length T

  def step_for(length: int):
    if length not in compiled:
      choice = compile_lib.learner_attention(cfg, mesh, length)
      if choice is not None:
        log(f"learner attention at {length} tokens: {choice.describe()}")
      compiled[length] = (compile_lib.compile_train_step(cfg, mesh, length),
                          compile_lib.batch_shardings(cfg, mesh, length))
    return compiled[length]

  # The writer (`run.checkpoint`): the caller holds the run lock (`jobs.train.run`).
  checkpointer = Checkpointer(cfg, writer=True) if cfg.checkpoint.directory else None

  def fresh_state(mesh):
    return compile_lib.init_sharded_state(cfg, mesh, jax.random.key(cfg.seed))

  resumed = bool(checkpointer and resume and checkpointer.latest_step() is not None)
  if resumed:
    state_sh = compile_lib.state_shardings(cfg, mesh)
    abstract = jax.tree.map(
        lambda leaf, sh: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sh),
        abstract_state(cfg), state_sh)
    state, data_state, _ = checkpointer.restore(checkpointed(cfg, abstract), log=log)
    if cfg.lora.enabled:
      state = with_frozen_parts(cfg, state, (base_state or initial_state or fresh_state)(mesh))
    if data_state:
      if not hasattr(batches, "set_state"):
        raise ValueError("the checkpoint holds a data-pipeline position but the batch iterator "
                         "has no set_state(); resume with the same kind of pipeline")
      batches.set_state(data_state)
  else:
    state = (initial_state or fresh_state)(mesh)

  phases = StepPhases() if phases is None else phases

  def report(step, metrics, host_metrics):
    on_metrics(step, {**jax.tree.map(float, jax.device_get(metrics)), **host_metrics,
                      **phases.record(step)})

  hosts = jax.process_count()

  def next_batch() -> tuple[Batch, dict] | None:
    """This step's (host rows, host metrics), padded to the hosts' common length."""
    try:
      item = next(batches)
      batch, host_metrics = (item, {}) if isinstance(item, Batch) else item
    except (StopIteration, Interrupted):  # which of the two: `watcher.requested`
      batch, host_metrics = None, {}
    if hosts == 1:
      return None if batch is None else (batch, host_metrics)
    length = distributed.agree_on_batch(None if batch is None else batch.shape[1])
    if length is None:
      return None
    return distributed.pad_length(batch, length, cfg.data.pad_id), host_metrics

  def place(batch: Batch, shardings: Batch) -> Batch:
    if hosts == 1:
      return compile_lib.put_batch(batch, shardings)
    return distributed.global_batch(batch, shardings, cfg.learner.batch_rows)

  start = int(jax.device_get(state.step))
  on_start(state, resumed)
  run_clock = clock()
  phases.restart()
  budget_s = cfg.run.max_wall_s
  own_watcher = watcher is None
  watcher = PreemptionWatcher() if own_watcher else watcher
  stopped_by, pending, saved = "steps", None, False
  step = start
  try:
    while step < cfg.learner.steps:
      asked = run_clock.now()
      with phases.timed("wait"):
        item = next_batch()
      if item is None:
        # SIGTERM while waiting (or the data ended after one): a preemption, saved below.
        stopped_by = "preemption" if watcher.requested else "data_exhausted"
        break
      batch, host_metrics = item
      host_metrics = {**host_metrics, **run_clock.step(
          wait_s=run_clock.now() - asked,
          trajectories=int(host_metrics.get(BATCH_TRAJECTORIES_KEY, 0)))}
      with jax.profiler.StepTraceAnnotation("learner_step", step_num=step):
        with phases.timed("compute"):
          step_fn, batch_sh = step_for(batch.shape[1])
          update_policy = update_policy_at(cfg.learner, cfg.algorithm, step)
          state, metrics = step_fn(state, place(batch, batch_sh), update_policy)
        if pending is not None:  # the previous step's metrics; this step is already queued
          with phases.timed("log"):
            report(*pending)
        with phases.timed("compute"):
          jax.block_until_ready(state)
      pending = (step, metrics, host_metrics)
      step += 1
      after_step(step, state)
      phases.cut(step - 1)
      # Read the flag once: SIGTERM may land between the save and the check, and
      # a preempted run must stop exactly at the step it saved.
      # Hosts stop together: SIGTERM may reach them at different steps.
      preempted = watcher.requested if hosts == 1 else distributed.any_host(watcher.requested)
      # The budget is checked like SIGTERM (hosts agree), and saved the same way.
      out_of_time = bool(budget_s) and run_clock.elapsed_s >= budget_s
      if hosts > 1 and budget_s:
        out_of_time = distributed.any_host(out_of_time)
      stop = preempted or out_of_time
      if checkpointer:
        # A checkpoint must not outrun the metrics of its steps; the save waits for
        # this step's result anyway, so reporting it first costs no overlap.
        if pending is not None and (stop or checkpointer.due(step)):
          with phases.timed("log"):
            report(*pending)
          pending = None
        with phases.timed("checkpoint"):
          checkpointer.save(step, checkpointed(cfg, state), _data_state(batches), force=stop)
      if stop:
        stopped_by, saved = ("preemption" if preempted else "wall_clock"), True  # with force
        break
    if pending is not None:
      report(*pending)
    if checkpointer and step > start and not saved:
      checkpointer.save(step, checkpointed(cfg, state), _data_state(batches), force=True)
  finally:
    if own_watcher:
      watcher.close()
    if checkpointer:
      checkpointer.close()
  return LearnerResult(state=state, steps_done=step, stopped_by=stopped_by)
