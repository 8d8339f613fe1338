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
failure, never the worker's (`sampler.episodes`).

Under LoRA the channel carries only the adapters: the worker loads the frozen
base once (`run.init`) and adopts each version as the base merged with them.

Until the first weights arrive an unreachable weight channel (a learner on
another slice that has not started serving) is waited for, not an error. After
that, a channel that drops or refuses the connection (a learner restarting, a
publisher at its subscriber cap, a network fault) is not the worker's end either:
it keeps sampling with the weights it has, finishing the episodes in flight, and
polls again after a wait that doubles from `_RECONNECT_FIRST_S` to
`_RECONNECT_MAX_S` per consecutive failure (each logged), reset by a clean poll.

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
An exception is reported to the supervisor with its traceback before the
process dies; the supervisor logs it and starts a fresh worker, which picks up
the newest weights.
"""

from __future__ import annotations

import ctypes
import dataclasses
import multiprocessing
import os
import queue
import signal
import sys
import time
from typing import Any, Callable

from sao_jax.channel.transport import TransportClosed
from sao_jax.config import Config
from sao_jax.log_text import logged_at, traceback_text, untrusted

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Waits before polling a weight channel again after it failed (module docstring).
_RECONNECT_FIRST_S, _RECONNECT_MAX_S = 1.0, 30.0


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
  """Everything a sampler process needs; picklable for spawn."""

  cfg: Config
  tokenizer_path: str
  weights: Any  # a publisher's .spec (sampler.weights selects the backend)
  transport: Any  # QueueTransport | DirectoryTransport
  worker_id: int = 0


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


def process_main(run: Callable[[WorkerSpec, Callable[[], bool]], None], spec: WorkerSpec,
                 stop: Any, errors: Any, parent_pid: int) -> None:
  """Process entry point: `run(spec, alive)` inside the lifecycle of the module
  docstring. `alive()` is False once stop is requested or the parent is gone."""
  die_with_parent(parent_pid)
  alive = lambda: not stop.is_set() and os.getppid() == parent_pid
  code = 0
  try:
    run(spec, alive)
  except Exception as error:  # report, then die: the supervisor restarts us
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
  over this process's devices; otherwise None (one device)."""
  if not cfg.sampler.sharded:
    return None
  import jax

  from sao_jax.sharding.mesh import make_mesh
  return make_mesh(cfg.sampler_mesh(), jax.local_devices())


def run_sampler(spec: WorkerSpec, alive: Callable[[], bool]) -> None:
  """The sampler loop (module docstring)."""
  from sao_jax.channel import weights
  from sao_jax.channel.published import published_to_policy
  from sao_jax.chat import load_chat
  from sao_jax.envs.registry import make_env, make_tasks
  from sao_jax.run.bootstrap import initial_policy
  from sao_jax.sampler.episodes import EpisodeRunner, make_engine
  from sao_jax.sampler.prompt_ids import PromptIds

  cfg = spec.cfg
  chat = load_chat(spec.tokenizer_path, enable_thinking=cfg.run.enable_thinking)
  chat.require_role(make_env(cfg.env).observation_role, f"env.name={cfg.env.name!r}")
  subscriber = weights.subscribe(spec.weights)
  log = lambda line: print(f"sampler {spec.worker_id}: {line}", file=sys.stderr, flush=True)
  skips = _SkipLog(log)
  got = None
  while got is None and alive():
    try:
      got = subscriber.poll()
    except ConnectionError:  # a learner on another slice that is not serving yet
      time.sleep(1.0)
      continue
    skips.report(subscriber)
    time.sleep(0.01 if got else 0.05)
  if got is None:
    return
  to_policy = published_to_policy(cfg, lambda: initial_policy(cfg))
  params, version = to_policy(got[0]), got[1]
  engine = make_engine(cfg.sampler, cfg.model, params, chat, version=version,
                       mesh=engine_mesh(cfg))
  runner = EpisodeRunner(engine, chat, lambda: make_env(cfg.env),
                         max_episodes=cfg.sampler.slots * 2,
                         env_threads=cfg.sampler.num_env_threads(),
                         step_timeout_s=cfg.env.step_timeout_s,
                         release=cfg.sampler.release_order, log=log)
  tasks = make_tasks(cfg.env)
  group = cfg.algorithm.group_size
  prompt_ids = PromptIds(group, cfg.algorithm.running_mean_slots, spec.worker_id)
  seed = cfg.sampler.seed * 1_000_003 + spec.worker_id * 7919
  started = 0
  reconnect = _Reconnect(log)
  try:
    while alive():
      got = reconnect.poll(subscriber)
      skips.report(subscriber)
      if got is not None:
        engine.set_params(to_policy(got[0]), got[1])
      while runner.can_start(group):
        task = next(tasks)
        prompt_id = prompt_ids(task)
        for _ in range(group):
          runner.start(task, prompt_id=prompt_id, seed=seed + started)
          started += 1
      for traj in runner.step():
        traj.info["worker"] = spec.worker_id
        if not hand_over(spec.transport, traj, alive):
          return
  finally:
    runner.close()
    subscriber.close()


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
  ConnectionError has passed (module docstring)."""

  def __init__(self, log: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
    self._log, self._clock = log, clock
    self._wait, self._retry_at = 0.0, 0.0

  def poll(self, subscriber):
    if self._clock() < self._retry_at:
      return None
    try:
      got = subscriber.poll()
    except ConnectionError as error:
      self._wait = min(max(2 * self._wait, _RECONNECT_FIRST_S), _RECONNECT_MAX_S)
      self._retry_at = self._clock() + self._wait
      self._log(f"weight channel unavailable ({untrusted(error, 500)}); sampling on with the "
                f"current weights, polling again in {self._wait:.0f} s")
      return None
    self._wait = 0.0
    return got


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


class SamplerSupervisor:
  """Starts, watches, restarts and stops sampler processes (learner side).

  `run` is what each process runs inside `process_main` (the sampler; a test
  can script another, picklable by reference). Call `start` and `check` from a
  thread that lives as long as the supervisor: a worker dies with the thread
  that spawned it (`die_with_parent`).
  """

  def __init__(self, specs: list[WorkerSpec], *, log: Callable[[str], None] = print,
               max_restarts: int = 10,
               run: Callable[[WorkerSpec, Callable[[], bool]], None] = run_sampler):
    self._specs, self._run = specs, run
    self._context = multiprocessing.get_context("spawn")
    self._stop = self._context.Event()
    self._errors = self._context.Queue()
    self._processes: dict[int, multiprocessing.Process] = {}
    self._log, self._max_restarts = log, max_restarts
    self.restarts = 0

  def _spawn(self, spec: WorkerSpec) -> None:
    # Each incarnation writes through a transport of its own: a restart must not
    # inherit the pipe lock or half-written message a killed predecessor left behind.
    spec = dataclasses.replace(spec, transport=spec.transport.for_writer(spec.worker_id))
    process = self._context.Process(
        target=process_main, name=f"sao-sampler-{spec.worker_id}",
        args=(self._run, spec, self._stop, self._errors, os.getpid()), daemon=True)
    process.start()
    self._processes[spec.worker_id] = process

  def start(self) -> None:
    for spec in self._specs:
      self._spawn(spec)

  def check(self) -> None:
    """Restarts dead workers, logging why they died; raises after `max_restarts`."""
    reports = {}
    while not self._errors.empty():
      worker_id, text = self._errors.get()
      reports[worker_id] = text
    for spec in self._specs:
      process = self._processes[spec.worker_id]
      if process.is_alive() or self._stop.is_set():
        continue
      process.join()
      why = reports.get(spec.worker_id, f"exit code {process.exitcode} (killed by a signal "
                        "if negative)")
      self.restarts += 1
      if self.restarts > self._max_restarts:
        raise RuntimeError(f"sampler {spec.worker_id} died {self.restarts} times; last: {why}")
      self._log(f"sampler {spec.worker_id} died ({why.strip().splitlines()[-1]}); restarting "
                f"with the newest weights [{self.restarts}/{self._max_restarts}]")
      if spec.worker_id in reports:
        self._log(reports[spec.worker_id])
      self._spawn(spec)

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
