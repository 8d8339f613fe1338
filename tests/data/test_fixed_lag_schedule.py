"""The fixed-lag schedule (`data.fixed_lag`): which version samples each batch, and the
learner's batches by schedule, whatever order the trajectories arrive in."""

import dataclasses

import numpy as np
import pytest

from sao_jax import config as C
from sao_jax.data import fixed_lag, pipeline
from sao_jax.data.fixed_lag import MEMBER_KEY, Schedule, ScheduledBatches
from traj_factory import ListTransport, make_traj


def schedule(lag=1, value_only=0, tasks=2, group=2, workers=1):
  return Schedule(lag=lag, tasks_per_batch=tasks, group_size=group, value_only_steps=value_only,
                  workers=workers)


def test_batch_t_is_sampled_by_the_policy_after_t_minus_lag_steps():
  # Two value-only steps leave the policy at version 0; then one update per step.
  assert [schedule(lag=0, value_only=2).sampling_version(t) for t in range(6)] == [0, 0, 0, 1, 2, 3]
  assert [schedule(lag=1, value_only=0).sampling_version(t) for t in range(5)] == [0, 0, 1, 2, 3]
  assert [schedule(lag=2, value_only=1).sampling_version(t) for t in range(6)] == [0, 0, 0, 0, 1, 2]
  # A run resumed at step 4 has only the version it resumed with for its first L batches.
  resumed = dataclasses.replace(schedule(lag=2), first_batch=4)
  assert [resumed.sampling_version(t) for t in range(4, 8)] == [4, 4, 4, 5]


def test_every_task_of_a_batch_is_sampled_by_exactly_one_worker():
  s = schedule(tasks=5, workers=2)
  shares = [list(s.positions(3, w)) for w in range(2)]
  assert shares == [[15, 17, 19], [16, 18]]
  assert all(s.batch_of(p) == 3 for share in shares for p in share)
  assert s.first_batch_of(s.task_start(3)) == 3


def test_the_schedule_reads_the_config():
  cfg = C.Config(data=C.DataConfig(fixed_lag=1),
                 algorithm=C.AlgorithmConfig.for_variant("grpo", group_size=4),
                 learner=C.LearnerConfig(batch_trajectories=16, critic_warmup_steps=3))
  s = Schedule.of(cfg)
  # GRPO has no critic: no value-only steps, whatever the warm-up says.
  assert (s.lag, s.tasks_per_batch, s.group_size, s.value_only_steps, s.workers) == (1, 4, 4, 0, 1)


def traj(position, member, version, seed=None):
  t = make_traj(length=6 + member, versions=(version, version),
                seed=position * 10 + member if seed is None else seed, prompt_id=position)
  t.info.update(task_position=position, **{MEMBER_KEY: member})
  return t


def batches(trajs, s, version=1, drops=None):
  return ScheduledBatches(ListTransport(trajs), s, batch_size=s.batch_trajectories,
                          buckets=(8, 16), pad_id=0, vocab_size=64, max_lag=2,
                          current_version=lambda: version,
                          drops=pipeline.Drops() if drops is None else drops)


def test_a_batch_is_the_same_whatever_order_its_trajectories_arrive_in():
  s = schedule(lag=1, tasks=2, group=2)
  arrivals = [traj(p, m, version=0) for p in range(4) for m in range(2)]
  rng = np.random.default_rng(0)
  runs = []
  for order in (range(8), rng.permutation(8), rng.permutation(8)[::-1]):
    it = batches([arrivals[i] for i in order], s)
    runs.append([next(it), next(it)])
  for (batch0, info0), (batch1, _) in runs[1:]:
    assert np.array_equal(batch0.tokens, runs[0][0][0].tokens)
    assert np.array_equal(batch1.tokens, runs[0][1][0].tokens)
    assert np.array_equal(info0.lengths, runs[0][0][1].lengths)
  # Rows in (position, member) order: batch 1 holds the tasks at positions 2 and 3.
  batch1 = runs[0][1][0]
  assert [int(row[0]) for row in batch1.prompt_ids] == [2, 2, 3, 3]
  assert np.array_equal(batch1.tokens[1, :7], traj(2, 1, 0).tokens)


def test_the_learner_waits_for_exactly_its_batch_and_drops_what_the_schedule_cannot_send():
  s = schedule(lag=0, tasks=1, group=1)
  drops = pipeline.Drops()
  late = traj(0, 0, 0, seed=99)  # a second copy of batch 0's only episode
  far = traj(s.ahead() + 1, 0, 0)  # further ahead than any sampler can be
  unnamed = make_traj(length=6)  # no task position: not from a scheduled sampler
  it = batches([traj(1, 0, 0), far, unnamed, traj(0, 0, 0), late, traj(2, 0, 0)], s,
               drops=drops)
  assert [next(it)[0].tokens[0, 0] for _ in range(3)] == [
      traj(p, 0, 0).tokens[0] for p in range(3)]
  assert drops["unscheduled"] == 3
  assert drops.examples["unscheduled"] == ("task position 2, member 0, the learner waiting for "
                                           "batch 0")  # the first: `far`
  with pytest.raises(StopIteration):  # the transport closed with nothing more for batch 3
    next(it)
  assert it.get_state() == {"next_batch": 3}


def test_a_batch_whose_every_trajectory_was_dropped_ends_the_run_saying_why():
  s = schedule(lag=0, tasks=1, group=1)
  failed = traj(0, 0, 0)
  failed.env_failure = "step raised ValueError: boom"
  with pytest.raises(RuntimeError, match=r"every trajectory of batch 0 was dropped.*fixed_lag"):
    next(batches([failed], s))


def test_sigterm_while_waiting_for_a_scheduled_batch_raises_interrupted_at_the_next_poll():
  s = schedule(lag=0, tasks=2, group=1)
  transport = ListTransport([traj(0, 0, 0), traj(1, 0, 0), traj(2, 0, 0)])
  it = ScheduledBatches(transport, s, batch_size=2, buckets=(8, 16), pad_id=0, vocab_size=64,
                        max_lag=2, current_version=lambda: 1, drops=pipeline.Drops(),
                        interrupted=lambda: not transport.trajs)  # SIGTERM once it is dry
  next(it)  # batch 0, whole
  with pytest.raises(pipeline.Interrupted):  # batch 1 has 1 of 2, and the transport is dry
    next(it)
  assert it.get_state() == {"next_batch": 1}  # its samplers sample batch 1 again on resume


def test_a_resumed_schedule_waits_for_the_batch_its_checkpoint_names():
  s = schedule(lag=1, tasks=1, group=1)
  it = batches([traj(4, 0, 3), traj(5, 0, 4)], s, version=4)
  it.set_state({"next_batch": 5})
  assert it.schedule.first_batch == 5
  assert next(it)[0].tokens[0, 0] == traj(5, 0, 4).tokens[0]
  with pytest.raises(ValueError, match="written by a run without it"):
    it.set_state({"counts": {}, "parent": {}})  # a default pipeline's state


def test_a_learner_behind_the_schedule_is_named():
  s = schedule(lag=1, value_only=3)
  fixed_lag.check_version(s, 5, 2)
  with pytest.raises(RuntimeError, match=r"after 5 learner steps the policy version is 1, not "
                     r"the 2 .*not finite"):
    fixed_lag.check_version(s, 5, 1)


@pytest.mark.parametrize("changes, field, words", [
    (dict(data=C.DataConfig(fixed_lag=-1)), "data.fixed_lag", "integer >= 0"),
    (dict(data=C.DataConfig(fixed_lag=True)), "data.fixed_lag", "integer >= 0"),
    (dict(data=C.DataConfig(fixed_lag=3, max_lag=2)), "data.fixed_lag",
     "set data.max_lag >= 3"),
    (dict(data=C.DataConfig(fixed_lag=1), learner=C.LearnerConfig(batch_tokens=4096, row_length=512)),
     "data.fixed_lag", "learner.batch_tokens=None"),
    (dict(data=C.DataConfig(fixed_lag=1), run=C.RunConfig(num_samplers=0)),
     "data.fixed_lag", "run.num_samplers >= 1"),
    (dict(data=C.DataConfig(fixed_lag=1), learner=C.LearnerConfig(batch_trajectories=4),
          run=C.RunConfig(num_samplers=5)), "run.num_samplers", "run.num_samplers <= 4"),
])
def test_bad_fixed_lag_settings_name_the_value_and_the_fix(changes, field, words):
  with pytest.raises(ValueError) as error:
    C.Config(**changes).validate()
  assert field in str(error.value) and words in str(error.value), error.value


def test_the_default_is_the_asynchronous_path():
  assert C.DataConfig().fixed_lag is None
  C.Config(data=C.DataConfig(fixed_lag=0)).validate()
