"""SIGTERM while the learner waits: the pipeline raises `Interrupted` at its next poll and
keeps every trajectory it had taken in its state (padded, packed and group batches)."""

import numpy as np
import pytest

from sao_jax.data import pipeline
from traj_factory import make_traj


class OpenTransport:
  """Hands out `trajs`, then polls empty (never closed: the samplers are still working)."""

  def __init__(self, trajs):
    self.trajs, self.closed, self.empty_polls = list(trajs), False, 0

  def get(self, timeout=0.0):
    if self.trajs:
      return self.trajs.pop(0)
    self.empty_polls += 1
    return None


def build(transport, flag, *, batch_size=4, group_size=1, **packing):
  return pipeline.learner_pipeline(
      transport, batch_size=batch_size, group_size=group_size, max_lag=2, buckets=(16,),
      pad_id=0, vocab_size=50, current_version=lambda: 5, drops=pipeline.Drops(),
      interrupted=lambda: flag["set"], on_poll=lambda: flag.update(
          set=flag["set"] or transport.empty_polls >= 2), **packing)


def trajectories_in(batch):
  """Each segment's tokens (a trajectory's), sorted."""
  return sorted(tuple(row[segment == k]) for row, segment in zip(batch.tokens, batch.segment_ids)
                for k in range(1, segment.max() + 1))


@pytest.mark.parametrize("packing", [{}, {"batch_tokens": 64, "row_length": 16}],
                         ids=["padded", "packed"])
@pytest.mark.parametrize("group_size", [1, 2])
def test_an_interrupted_wait_keeps_the_gathered_rows_for_the_next_batch(packing, group_size):
  first = [make_traj(length=8, prompt_id=i // group_size, seed=i) for i in range(4)]
  gathered = [make_traj(length=8, prompt_id=10 + i // group_size, seed=10 + i) for i in range(2)]
  flag = {"set": False}
  it = build(OpenTransport(first + gathered), flag, group_size=group_size, **packing)
  next(it)  # the first batch, whole
  with pytest.raises(pipeline.Interrupted):
    next(it)  # two of four rows arrived, then SIGTERM: no half batch is trained
  state = it.get_state()

  later = [make_traj(length=8, prompt_id=20 + i // group_size, seed=20 + i) for i in range(2)]
  resumed = build(OpenTransport(later), {"set": False}, group_size=group_size, **packing)
  resumed.set_state(state)
  batch, info = next(resumed)
  assert trajectories_in(batch) == sorted(tuple(t.tokens) for t in gathered + later)
  assert info.padding_rows == (2 if packing else 0)  # packed: two rows of 16 hold all four


def test_an_interrupt_is_raised_before_the_next_poll_even_while_trajectories_arrive():
  """A stream that never runs dry (every trajectory dropped, say) must still stop."""
  transport = OpenTransport([make_traj(length=8, seed=i) for i in range(100)])
  it = build(transport, {"set": True})
  with pytest.raises(pipeline.Interrupted):
    next(it)
  assert len(transport.trajs) == 100


def test_without_an_interrupt_an_open_transport_keeps_waiting_and_end_of_data_still_ends():
  """`should_stop` (the end of the data) still yields the last, partial batch."""
  transport = OpenTransport([make_traj(length=8, seed=i) for i in range(3)])
  it = pipeline.learner_pipeline(
      transport, batch_size=4, group_size=1, max_lag=2, buckets=(16,), pad_id=0,
      vocab_size=50, current_version=lambda: 5, drops=pipeline.Drops(),
      should_stop=lambda: transport.empty_polls >= 3)
  batch, info = next(it)
  assert info.padding_rows == 1 and np.count_nonzero(batch.segment_ids.any(1)) == 3
  assert transport.empty_polls == 3
