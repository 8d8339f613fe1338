"""The sampler process: generates continuously and streams finished trajectories.

    supervisor = SamplerSupervisor(spec)   # in the learner process
    supervisor.start()                     # spawns process_main(run_sampler, spec, ...)
    supervisor.check()                     # between learner steps: restart if it died
    supervisor.stop()                      # clean shutdown, no orphans

`run_sampler` runs in its own process (multiprocessing "spawn", never fork,
with JAX) on its own devices. It waits for the first published weights, then
loops without ever waiting for the learner: adopt the newest weights between
engine steps, keep the engine saturated with new episodes, hand every finished
trajectory to the transport (which blocks when the learner is far behind: that
is the backpressure). In group mode (GRPO) each task is started `group_size`
times with different seeds and one prompt id. An episode that fails (its
environment raised, its observation could not be encoded) is that episode's
failure, never the worker's (`sampler.episodes`); so is a task that could not be
made (a dataset row gone bad since the start-up check: each of its episodes is a
failed trajectory naming the file, row and column, which the learner counts as
`dropped/env_failure/BadRow`).

Tasks come from the worker's stream from `WorkerSpec.task_start` on
(`data.task_positions`: the supervisor gives a restarted worker where the tasks
that reached the learner leave its stream, a checkpoint keeps it across
`--resume`), and each trajectory carries its task's position in the stream
(`info["task_position"]`). An episode's seed is a function of the worker, that
position and its place in the group, so a restarted worker samples as the one
before it would have.

With `data.fixed_lag` the loop is `sampler.scheduled.sample_scheduled` instead: the
worker samples its share of each batch with the one policy version the schedule names
(`data.fixed_lag`), so a seed's run repeats whatever the machine's load, and a worker
that dies is not restarted (the versions its batches need are gone): the run ends.

Under LoRA the channel carries only the adapters: the worker loads the frozen
base once (`run.init`) and adopts each version as the base merged with them.

The weight channel is polled on a thread of its own (`_Poller`), every `_POLL_S`
while nothing new comes: a poll, or the transfer of a version, never holds the
sampling loop, which adopts a version between engine steps once it has arrived.
A network fault on the weight channel is a wait, never the worker's end: a
channel that drops or refuses the connection (a learner restarting, a publisher
at its subscriber cap, a reset) or stops answering (a stalled learner, a
partition mid-transfer: `TimeoutError` after the channel's deadline) makes the
worker keep sampling with the weights it has, finishing the episodes in flight,
and poll again after a wait that doubles from `_RECONNECT_FIRST_S` to
`_RECONNECT_MAX_S` per consecutive fault (the 1st, 2nd, 4th, ... in a row logged),
reset by a clean poll; before the first weights (a learner on another slice
that has not started serving) it waits the same way. So the supervisor's restart
budget counts crashes only. Each trajectory handed over carries the faults
waited out (`info["weight_waits"]`) and the peer errors and refused versions its
subscriber counted (`info["weight_errors"]`) since the one before, which the
learner sums into `weights/sampler_waits` and `weights/sampler_errors`.

Samplers die with their learner. `process_main` wraps the run:
- the kernel SIGKILLs the worker when the learner dies by any signal (Linux
  `PR_SET_PDEATHSIG`, set first thing in the child; a parent that died before
  that is caught by comparing `os.getppid()` right after);
- every blocking loop re-checks `alive()` (stop not requested, parent pid
  unchanged), the fallback where the signal is unavailable;
- the process ends with `os._exit`, never by flushing its queues: a queue's
  feeder thread blocked on a full pipe that nobody will read again would hold
  the exit (and the accelerator) forever. Trajectories not yet in the pipe are
  dropped; the learner is stopping or gone.
Whatever ends `run` other than a return (an exception, a `sys.exit` in code it
calls, a KeyboardInterrupt) is reported to the supervisor with its traceback
before the process dies (exit code 1); the supervisor logs it and starts a fresh
worker, which picks up the newest weights. A worker that is found dead while stop
was not requested is a crash, report or not, whatever its exit code (0
included): it counts against `max_restarts` and is logged with its exit code.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator

from sao_jax.channel.transport import TransportClosed
from sao_jax.config import Config
from sao_jax.data.task_positions import TaskStart
from sao_jax.sampler.task_stream import served
from sao_jax.log_text import logged_at, traceback_text, untrusted

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Waits before polling a weight channel again after it failed (module docstring).
_RECONNECT_FIRST_S, _RECONNECT_MAX_S = 1.0, 30.0
_POLL_S = 0.05  # between polls of the weight channel (`_Poller`) when nothing new came
_POLL_JOIN_S = 1.0  # how long closing waits for a poll under way
START_METHOD = "spawn"  # never fork with JAX (module docstring)


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
  """Everything a sampler process needs; picklable for spawn."""

  cfg: Config
  tokenizer_path: str
  weights: Any  # a publisher's .spec (sampler.weights selects the backend)
  transport: Any  # QueueTransport | DirectoryTransport
  worker_id: int = 0
  # Where its task stream starts (`data.task_positions`; the supervisor sets it).
  task_start: TaskStart = TaskStart()
  # Environment variables the process starts with (`spawned_with`): the devices it
  # may open (`sao_jax.sharding.device_split`: `sampler_env`, on TPU `tpu_plan`).
  env: tuple[tuple[str, str], ...] = ()
  # The learner's profiler window (`run.profile.ProfileSignal`; None: never traced).
  profile: Any = None
  # One engine over several hosts: where this process joins its group
  # (`engine_group.GroupSpec`, sao-sampler --coordinator); None: its own engine.
  group: Any = None


def die_with_parent(parent_pid: int) -> None:
  """Has the kernel SIGKILL this process when its parent dies; exits now if the
  parent is already gone (it can die between spawn and this call).

  SIGKILL rather than SIGTERM: accelerator runtimes install SIGTERM handlers
  (preemption notices), and a killed process runs no exit code that could wait
  on a queue. The signal follows the parent *thread* that spawned us, so the
  supervisor must start workers from a thread that lives as long as it does.
  """
  if sys.platform.startswith("linux"):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
      # Not fatal: the liveness checks still end the worker, only later.
      print(f"sampler: prctl(PR_SET_PDEATHSIG) failed ({os.strerror(ctypes.get_errno())}); "
            "this worker exits within seconds of its learner, not at once", file=sys.stderr)
  if os.getppid() != parent_pid:
    exit_without_flushing(0)


def exit_without_flushing(code: int) -> None:
  """Ends the process now: stdio flushed, but no atexit handlers or finalizers,
  so no join on a multiprocessing queue's feeder thread (module docstring)."""
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):  # a closed or broken stream: nothing left to save
      pass
  os._exit(code)


@contextlib.contextmanager
def spawned_with(variables: dict[str, str]) -> Iterator[None]:
  """`os.environ` with `variables` set, restored after: a process spawned inside
  starts with them, so JAX reads them when it is first imported there (its config
  flags, e.g. JAX_NUM_CPU_DEVICES, are read at import, before `process_main` could
  set anything). Spawns happen on the supervisor's thread, one at a time."""
  saved = {name: os.environ.get(name) for name in variables}
  os.environ.update(variables)
  try:
    yield
  finally:
    for name, value in saved.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value


def process_main(run: Callable[[WorkerSpec, Callable[[], bool]], None], spec: WorkerSpec,
                 stop: Any, errors: Any, parent_pid: int) -> None:
  """Process entry point: `run(spec, alive)` inside the lifecycle of the module
  docstring. `alive()` is False once stop is requested or the parent is gone."""
  die_with_parent(parent_pid)
  alive = lambda: not stop.is_set() and os.getppid() == parent_pid
  code = 0
  try:
    run(spec, alive)
  # Report, then die: the supervisor restarts us. SystemExit too: a sys.exit in code the
  # sampler runs (a plugin's) would otherwise end it with code 0 and nothing said.
  except BaseException as error:
    code = 1
    # Messages escaped: a peer's file name or reply can be in them, and the learner logs it.
    report = traceback_text(error)
    print(f"sampler {spec.worker_id} failed:\n{report}", file=sys.stderr)
    errors.put((spec.worker_id, report))
    # One report fits the pipe, so this returns without a reader.
    errors.close()
    errors.join_thread()
  exit_without_flushing(code)


def engine_mesh(cfg: Config):
  """The mesh a sampler process's engine lays params and KV cache out over: with
  `sampler.sharded`, `cfg.sampler_mesh()` (sampler.mesh, else the top-level mesh)
  over this process's devices, or in an engine group (`engine_group`) over every
  device of its processes; otherwise None (one device)."""
  if not cfg.sampler.sharded:
    return None
  import jax

  from sao_jax.sharding.mesh import make_mesh
  devices = jax.devices() if jax.process_count() > 1 else jax.local_devices()
  # The refusal that names the fix.
  cfg.sampler_mesh_shape(len(devices), processes=jax.process_count())
  return make_mesh(cfg.sampler_mesh(), devices)


def run_sampler(spec: WorkerSpec, alive: Callable[[], bool]) -> None:
  """The sampler loop (module docstring)."""
  from sao_jax.channel import weights
  from sao_jax.chat import load_chat
  from sao_jax.envs.registry import make_env

  cfg = spec.cfg
  if spec.group is not None:  # before anything touches JAX
    spec.group.join(cfg.sampler.group_timeout_s)
  chat = load_chat(spec.tokenizer_path, enable_thinking=cfg.run.enable_thinking)
  chat.require_role(make_env(cfg.env).observation_role, f"env.name={cfg.env.name!r}")
  subscriber = weights.subscribe(spec.weights)
  log = lambda line: print(f"sampler {spec.worker_id}: {line}", file=sys.stderr, flush=True)
  poller = _Poller(subscriber, _Reconnect(log), _SkipLog(log))
  try:
    _sample(spec, alive, cfg, chat, poller, log)
  finally:
    poller.close()


def _sample(spec: WorkerSpec, alive: Callable[[], bool], cfg: Config, chat, poller: _Poller,
            log: Callable[[str], None]) -> None:
  """`run_sampler` once its channel is polled (by `poller`, on its own thread)."""
  from sao_jax.channel.published import published_to_policy
  from sao_jax.envs.registry import describe, make_env, make_tasks
  from sao_jax.run.bootstrap import initial_policy
  from sao_jax.run.phases import SamplerPhases
  from sao_jax.run.profile import SamplerTrace
  from sao_jax.sampler import multihost, paged_steps
  from sao_jax.sampler.episodes import EpisodeRunner, make_engine
  from sao_jax.sampler.prompt_ids import PromptIds

  got = None
  while got is None and alive():  # a learner not serving yet is waited for
    got = poller.take()
    if got is None:
      time.sleep(_POLL_S)
  if got is None:
    return
  to_policy = published_to_policy(cfg, lambda: initial_policy(cfg))
  params, version = to_policy(got[0]), got[1]
  mesh = engine_mesh(cfg)
  engine = make_engine(cfg.sampler, cfg.model, params, chat, version=version, mesh=mesh)
  if cfg.sampler.kv_layout == "paged":  # which attention runs, and why (a TPU may not take it)
    log("paged attention: %s (%s)" % paged_steps.attention_choice(cfg.sampler, cfg.model, mesh))
  peers = None
  if spec.group is not None:  # one engine over several hosts: process 0 leads
    from sao_jax.sampler import engine_group
    peers = multihost.Group(timeout_s=cfg.sampler.group_timeout_s)
    if not peers.leader:
      engine_group.follow_leader(engine, peers, got, poller, to_policy, alive=alive, log=log)
      return
    # `runner` is read when a stall ends the group, after it is built below.
    engine = engine_group.lead(engine, peers, got, to_policy, log=log,
                               in_flight=lambda: runner.in_flight)
  runner = EpisodeRunner(engine, chat, lambda: make_env(cfg.env),
                         max_episodes=cfg.sampler.slots * 2,
                         env_threads=cfg.sampler.num_env_threads(),
                         step_timeout_s=cfg.env.step_timeout_s,
                         release=cfg.sampler.release_order, log=log,
                         env_name=describe(cfg.env), latency=cfg.env.latency,
                         # A fixed lag fixes the engine's schedule too (`sampler.scheduled`).
                         overlap=cfg.data.fixed_lag is None)
  # Where the loop's time goes (`run.phases`), carried by each trajectory handed over.
  phases, trace = SamplerPhases(engine, runner), SamplerTrace(spec.profile, spec.worker_id)
  if cfg.data.fixed_lag is not None:  # reproducible rollouts: batches by schedule
    from sao_jax.sampler.scheduled import sample_scheduled
    sample_scheduled(spec, alive, engine=engine, runner=runner, to_policy=to_policy, first=got,
                     poller=poller, counts=_ChannelCounts(poller), log=log,
                     hand_over=lambda traj: hand_over(spec.transport, traj, alive),
                     phases=phases, trace=trace)
    return
  tasks = served(lambda start: make_tasks(cfg.env, start=start), spec.task_start)
  group = cfg.algorithm.group_size
  prompt_ids = PromptIds(group, cfg.algorithm.running_mean_slots, spec.worker_id)
  seed = cfg.sampler.seed * 1_000_003 + spec.worker_id * 7919
  task_position: dict[int, int] = {}  # episode id -> its task's position in the stream
  counts = _ChannelCounts(poller)
  pending = None  # in a group: a version not every process holds yet
  try:
    while alive():
      got = poller.take()
      if got is not None and peers is not None:  # adopted once every process holds it
        peers.announce(got[1])
        got, pending = None, got
      if pending is not None and peers.held_by_all(pending[1]):
        got, pending = pending, None
      if got is not None:
        engine.set_params(to_policy(got[0]), got[1])
      phases.lap("adopt")
      while runner.can_start(group):
        position, task = next(tasks)
        for episode in start_task(runner, task, prompt_ids,
                                  [seed + position * group + m for m in range(group)]):
          task_position[episode] = position
      phases.lap("start")
      with trace.engine_step():
        finished = runner.step()
      phases.lap("step")
      for traj in finished:
        traj.info["worker"] = spec.worker_id
        traj.info["task_position"] = task_position.pop(traj.info["episode"])
        traj.info["weight_waits"], traj.info["weight_errors"] = counts.take()
        traj.info["phases"] = phases.take()
        if not hand_over(spec.transport, traj, alive):
          return
        phases.lap("handover")
  except multihost.GroupFailed as error:
    log(f"engine group ended ({error}): {runner.in_flight} episodes in flight dropped")
    peers = None  # nothing more is sent to a group that ended
    raise
  finally:
    if peers is not None:
      engine.close()  # the followers return
    trace.close()
    runner.close()


def start_task(runner, task, prompt_ids, seeds: list[int]) -> list[int]:
  """Starts an episode of `task` (a `Task`, or the `BadRow` a dataset row made instead)
  per seed of `seeds` (a GRPO group: one per member) under one prompt id (`PromptIds`);
  their episode ids, in order. A bad row's episodes are counted failures naming the row."""
  from sao_jax.envs.base import Task
  from sao_jax.envs.dataset_tasks import BadRow

  bad = task if isinstance(task, BadRow) else None
  if bad is not None:  # each of its episodes a counted failure, named by the row
    task = Task(id=bad.where, prompt="", answer="")
  prompt_id = prompt_ids(task)
  if bad is not None:
    return [runner.reject(task, bad, prompt_id=prompt_id) for _ in seeds]
  return [runner.start(task, prompt_id=prompt_id, seed=seed) for seed in seeds]


class _SkipLog:
  """Reports each version a subscriber skipped (`DirectorySubscriber.skipped`: it did not
  restore, or did not check against the learner's signatures) once, with why: a sampler
  that never adopts a version says so instead of waiting in silence.

  A peer who can write the weights directory makes one report per version directory it
  plants (and again after churning the name), so only the 1st, 2nd, 4th, 8th, ... report
  is logged, with the count so far (as `weights_wire.count_error` logs peer errors), and
  `why` (an error message about the peer's files) is escaped (`log_text.untrusted`).
  """

  def __init__(self, log: Callable[[str], None]):
    self._log = log
    self._told: dict[int, str] = {}  # version -> why, as last reported
    self.reports = 0

  def report(self, subscriber) -> None:
    skipped = getattr(subscriber, "skipped", {})
    for version in set(self._told) - set(skipped):  # gone from the directory: its memory too
      del self._told[version]
    for version, why in skipped.items():
      if self._told.get(version) != why:
        self._told[version] = why
        self.reports += 1
        if logged_at(self.reports):
          self._log(f"weight version {version} skipped: {untrusted(why, 500)} "
                    f"(skipped version #{self.reports}; logged at 1, 2, 4, 8, ...)")


class _Reconnect:
  """`subscriber.poll()`, or None without touching the network until the wait after a
  network fault (ConnectionError: refused, reset, closed; TimeoutError: no answer within
  the channel's deadline) has passed (module docstring). `waits` counts the faults by
  kind ("connection", "timeout")."""

  def __init__(self, log: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
    self._log, self._clock = log, clock
    self._wait, self._retry_at = 0.0, 0.0
    self._streak = 0  # consecutive faults
    self.waits: collections.Counter = collections.Counter()

  def poll(self, subscriber):
    if self._clock() < self._retry_at:
      return None
    try:
      got = subscriber.poll()
    except (ConnectionError, TimeoutError) as error:
      kind = "timeout" if isinstance(error, TimeoutError) else "connection"
      self.waits[kind] += 1
      self._streak += 1
      self._wait = min(max(2 * self._wait, _RECONNECT_FIRST_S), _RECONNECT_MAX_S)
      self._retry_at = self._clock() + self._wait
      if logged_at(self._streak):
        self._log(f"weight channel unavailable ({untrusted(error, 500)}); sampling on with "
                  f"the current weights, polling again in {self._wait:.0f} s (fault "
                  f"#{self._streak} in a row; logged at 1, 2, 4, 8, ...)")
      return None
    self._wait, self._streak = 0.0, 0
    return got


class _Poller:
  """Polls the weight channel (`_Reconnect`) on a thread of its own, so that a learner
  that stalls holds that thread for up to the channel's deadline, never the sampling
  loop, and hands the newest version over through `take()`. It holds at most one
  version not yet taken: it polls again only once that one is taken. An error that is
  not a network fault (another model served, a bug) is raised by the next `take()`,
  and ends the worker as before."""

  def __init__(self, subscriber, reconnect: _Reconnect, skips: _SkipLog):
    self._subscriber, self._reconnect, self._skips = subscriber, reconnect, skips
    self._lock = threading.Lock()
    self._ready: Any = None  # (params, version) not yet taken
    self._error: BaseException | None = None
    self._stop = threading.Event()
    self.counts = (0, 0)  # (network faults waited out, the subscriber's peer errors)
    self._thread = threading.Thread(target=self._run, name="sao-weights-poll", daemon=True)
    self._thread.start()

  def _run(self) -> None:
    try:
      while not self._stop.is_set():
        with self._lock:
          pending = self._ready is not None
        got = None if pending else self._reconnect.poll(self._subscriber)
        self._skips.report(self._subscriber)
        self.counts = (sum(self._reconnect.waits.values()),
                       sum(getattr(self._subscriber, "stats", {}).values()))
        if got is not None:
          with self._lock:
            self._ready = got
        else:
          self._stop.wait(_POLL_S)
    except BaseException as error:  # reported by take(), in the sampling thread
      self._error = error

  def take(self):
    """The newest version polled since the last call, or None."""
    if self._error is not None:
      raise self._error
    with self._lock:
      got, self._ready = self._ready, None
    return got

  def close(self) -> None:
    """Stops polling (a poll under way ends within the channel's deadline; the thread is
    not waited for longer than `_POLL_JOIN_S`), then closes the subscriber."""
    self._stop.set()
    self._thread.join(_POLL_JOIN_S)
    self._subscriber.close()


class _ChannelCounts:
  """What the weight channel counted since the last `take()`: (network faults waited
  out, peer errors and refused versions of the subscriber's `stats`)."""

  def __init__(self, poller: _Poller):
    self._poller = poller
    self._taken = (0, 0)

  def take(self) -> tuple[int, int]:
    now = self._poller.counts
    delta = (now[0] - self._taken[0], now[1] - self._taken[1])
    self._taken = now
    return delta


def hand_over(transport, traj, alive: Callable[[], bool], poll_s: float = 1.0) -> bool:
  """Puts `traj`, waiting while the transport is full (backpressure) but re-checking
  `alive` every `poll_s`: a learner killed with a full queue never closes it, and a
  sampler blocked in `put` would outlive it. False: the sampler should exit."""
  while alive():
    try:
      transport.put(traj, timeout=poll_s)
      return True
    except queue.Full:
      continue
    except TransportClosed:
      return False
  return False


def _unreported(exitcode: int) -> str:
  """Why a worker that left no report died, from its exit code."""
  if exitcode < 0:
    return f"exit code {exitcode}: killed by signal {-exitcode}, no report"
  return (f"exit code {exitcode} with no report: a sampler exits only when stopped, so "
          "this is a crash")


class SamplerSupervisor:
  """Starts, watches, restarts and stops sampler processes (learner side).

  `run` is what each process runs inside `process_main` (the sampler; a test
  can script another, picklable by reference). `task_start(worker_id)` is where
  a worker started now begins its task stream (`TaskPositions.start`; default: the
  start of the stream). `no_restart`, when given, says why a dead worker ends the run
  instead of being restarted (`data.fixed_lag`). `max_restarts` counts crashes: a
  weight channel that stalls or drops is waited out inside the worker (module
  docstring), never a death. Call `start` and `check` from a
  thread that lives as long as the supervisor: a worker dies with the thread
  that spawned it (`die_with_parent`).
  """

  def __init__(self, specs: list[WorkerSpec], *, log: Callable[[str], None] = print,
               max_restarts: int = 10,
               run: Callable[[WorkerSpec, Callable[[], bool]], None] = run_sampler,
               task_start: Callable[[int], TaskStart] = lambda worker_id: TaskStart(),
               no_restart: str = ""):
    self._specs, self._run, self._task_start = specs, run, task_start
    self._no_restart = no_restart
    self._waiting_reports: dict[int, str] = {}
    self._context = multiprocessing.get_context(START_METHOD)
    self._stop = self._context.Event()
    self._errors = self._context.Queue()
    self._processes: dict[int, multiprocessing.Process] = {}
    self._log, self._max_restarts = log, max_restarts
    self.restarts = 0

  def _spawn(self, spec: WorkerSpec) -> None:
    # Each incarnation writes through a transport of its own: a restart must not
    # inherit the pipe lock or half-written message a killed predecessor left behind.
    # It goes on with its task stream after the tasks whose episodes reached the learner.
    spec = dataclasses.replace(spec, transport=spec.transport.for_writer(spec.worker_id),
                               task_start=self._task_start(spec.worker_id))
    process = self._context.Process(
        target=process_main, name=f"sao-sampler-{spec.worker_id}",
        args=(self._run, spec, self._stop, self._errors, os.getpid()), daemon=True)
    with spawned_with(dict(spec.env)):
      process.start()
    self._processes[spec.worker_id] = process

  def start(self) -> None:
    for spec in self._specs:
      self._spawn(spec)

  def check(self) -> None:
    """Restarts dead workers, logging why they died; raises after `max_restarts`."""
    # Kept across calls: a report read while its worker was still exiting belongs to
    # the death the next call finds.
    reports = self._waiting_reports
    reports.update(self._reports())
    for spec in self._specs:
      process = self._processes[spec.worker_id]
      if process.is_alive() or self._stop.is_set():
        continue
      process.join()
      # A worker that reported and exited after the drain above: its report is in the
      # pipe once it has exited (it joins its queue's feeder before it dies), so read
      # again, or a reported death would read as one without a report.
      reports.update(self._reports())
      why = reports.pop(spec.worker_id, None) or _unreported(process.exitcode)
      if self._no_restart:
        raise RuntimeError(f"sampler {spec.worker_id} died ({why.strip().splitlines()[-1]}) "
                           f"and is not restarted: {self._no_restart}\n{why}")
      self.restarts += 1
      if self.restarts > self._max_restarts:
        raise RuntimeError(f"sampler {spec.worker_id} died {self.restarts} times; last: {why}")
      self._log(f"sampler {spec.worker_id} died ({why.strip().splitlines()[-1]}); restarting "
                f"with the newest weights [{self.restarts}/{self._max_restarts}]")
      if not why.startswith("exit code"):  # a report: its traceback
        self._log(why)
      self._spawn(spec)

  def _reports(self) -> dict[int, str]:
    """The death reports waiting in the error queue, by worker id."""
    reports = {}
    while not self._errors.empty():
      worker_id, text = self._errors.get()
      reports[worker_id] = text
    return reports

  def pids(self) -> list[int]:
    return [p.pid for p in self._processes.values() if p.is_alive()]

  def stop(self, timeout: float = 10.0) -> None:
    """Asks workers to exit, then terminates and kills any that do not."""
    self._stop.set()
    for process in self._processes.values():
      process.join(timeout)
      if process.is_alive():
        process.terminate()
        process.join(2.0)
      if process.is_alive():
        process.kill()
        process.join()
