"""A sampler worker's loop under `data.fixed_lag` (`sao_jax.data.fixed_lag`: the schedule).

`sample_scheduled` replaces the worker's asynchronous loop (`sampler.worker`): it
starts the episodes of its share of batch t, t + 1, ... in (position, member) order,
each batch with the weights of `Schedule.sampling_version(t)`, and hands batch t's
trajectories over once the learner published `policy_version_after(t)`. So every
input of the engine is a function of the seed and positions:

- Weights: every version the channel delivers is kept until no later batch needs it
  (at most L + 1); the engine switches to a batch's version only when no episode is in
  flight, so no episode mixes versions, and a batch whose version has not come yet
  waits (logged every `WAIT_LOG_S`).
- The engine's schedule: the runner runs with `overlap=False` (every turn's
  environment step is applied before the next engine step, in turn order), so which
  turns share a prefill or decode call, which slot each takes and which parked slot is
  evicted do not depend on how long environment steps take. That matters beyond slots:
  on the CPU backend the paged engine's batched prefill is not batch-invariant (a
  prompt prefilled beside others gave behavior_logp differing by ~1e-6 from the same
  prompt prefilled alone), so a fixed engine schedule, not invariance, gives identical
  tokens and log-probs.
- Seeds and tasks: `fixed_lag.episode_seed` of the task's position; latency draws come
  from the episode's seed (`sampler.latency`); GRPO group ids count from the first task's
  position.

Instruments, as in the asynchronous loop: the loop's time is split into laps
(`run.phases.SamplerPhases`), with one phase of its own, `version_wait` (nothing in
flight while the next batch's version has not come), and each trajectory carries the
laps since the previous one handed over (`info["phases"]`, taken when it is handed
over, not when it finishes: a finished batch is held until the learner needs it). Each
engine step is marked, and traced inside a `--profile` window (`run.profile.SamplerTrace`).
"""

from __future__ import annotations

import collections
import time
from typing import Callable

from sao_jax.data.fixed_lag import MEMBER_KEY, Schedule, episode_seed
from sao_jax.types import COUNTER_BITS

WAIT_LOG_S = 30.0  # how often a sampler waiting for a policy version says so
_IDLE_S = 0.01  # sleep of a loop with nothing to sample


def sample_scheduled(spec, alive: Callable[[], bool], *, engine, runner, to_policy,
                     first: tuple, poller, counts, hand_over: Callable, log: Callable[[str], None],
                     phases, trace) -> None:
  """The scheduled sampler loop (module docstring). `first`: the (published params,
  version) the worker started with; `hand_over(traj) -> bool` puts a trajectory on
  the transport (False: stop); `phases` (a `SamplerPhases` of `engine` and `runner`)
  and `trace` (a `SamplerTrace`, closed on the way out) are the instruments."""
  from sao_jax.envs.registry import make_tasks
  from sao_jax.sampler.prompt_ids import PromptIds
  from sao_jax.sampler.task_stream import served
  from sao_jax.sampler.worker import start_task

  cfg = spec.cfg
  group = cfg.algorithm.group_size
  schedule = Schedule.of(cfg)
  schedule = Schedule.of(cfg, first_batch=schedule.first_batch_of(spec.task_start))
  start = schedule.task_start(schedule.first_batch)
  tasks = served(lambda k: make_tasks(cfg.env, start=k), start)
  prompt_ids = PromptIds(group, cfg.algorithm.running_mean_slots, spec.worker_id,
                         start=start.position % 2 ** COUNTER_BITS)
  versions = {first[1]: first[0]}  # version -> published params, while a batch may need it
  newest = first[1]

  def share(batch: int) -> collections.deque:
    """(position, task) of this worker's tasks of `batch` (the stream goes in order)."""
    out = collections.deque()
    for wanted in schedule.positions(batch, spec.worker_id):
      position, task = next(tasks)
      while position < wanted:
        position, task = next(tasks)
      out.append((position, task))
    return out

  batch = schedule.first_batch
  todo = share(batch)  # what of `batch` is still to start
  finished: dict[int, list] = collections.defaultdict(list)  # batch -> trajectories held
  started: dict[int, tuple[int, int]] = {}  # episode id -> (position, member)
  waiting_since = last_log = None
  try:
    while alive():
      got = poller.take()
      if got is not None:
        versions[got[1]], newest = got[0], max(newest, got[1])
      phases.lap("adopt")
      for done in sorted(finished):  # a batch goes out once the learner trained its predecessor
        if schedule.policy_version_after(done) > newest:
          break
        for traj in finished.pop(done):
          traj.info["phases"] = phases.take()
          if not hand_over(traj):
            return
          phases.lap("handover")
      need = schedule.sampling_version(batch)
      if need != engine.version and not runner.in_flight:
        if need in versions:
          engine.set_params(to_policy(versions[need]), need)
          for old in [v for v in versions if v < need]:
            del versions[old]
          waiting_since = None
        elif waiting_since is None:
          waiting_since = last_log = time.monotonic()
        elif time.monotonic() - last_log >= WAIT_LOG_S:
          last_log = time.monotonic()
          log(f"data.fixed_lag={schedule.lag}: batch {batch} waits for policy version {need} "
              f"({last_log - waiting_since:.0f} s; the newest received is {newest})")
      phases.lap("adopt")
      while need == engine.version and runner.can_start(group):
        position, task = todo.popleft()
        seeds = [episode_seed(cfg.sampler.seed, position, group, m) for m in range(group)]
        for member, episode in enumerate(start_task(runner, task, prompt_ids, seeds)):
          started[episode] = (position, member)
        if not todo:
          batch += 1
          todo = share(batch)
          need = schedule.sampling_version(batch)
      phases.lap("start")
      if not runner.in_flight:  # nothing to sample until the learner publishes `need`
        time.sleep(_IDLE_S)
        phases.lap("version_wait")
        continue
      with trace.engine_step():
        stepped = runner.step()
      phases.lap("step")
      for traj in stepped:
        position, member = started.pop(traj.info["episode"])
        traj.info["worker"], traj.info["task_position"] = spec.worker_id, position
        traj.info[MEMBER_KEY] = member
        traj.info["weight_waits"], traj.info["weight_errors"] = counts.take()
        finished[schedule.batch_of(position)].append(traj)
  finally:
    trace.close()
    runner.close()
