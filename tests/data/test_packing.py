"""Token-budget batches: first-fit packing, whole groups, row counts, padding fraction."""

import numpy as np
import pytest

from sao_jax.config.learner import LearnerConfig
from sao_jax.data import pipeline
from traj_factory import ListTransport, make_traj


def build(trajs, *, batch_tokens=64, row_length=16, batch_size=8, group_size=1, step=5):
  drops = pipeline.Drops()
  it = pipeline.learner_pipeline(ListTransport(trajs), batch_size=batch_size,
                                 group_size=group_size, max_lag=2, buckets=(8, 16, 32), pad_id=0,
                                 vocab_size=50, current_version=lambda: step, drops=drops,
                                 batch_tokens=batch_tokens, row_length=row_length)
  return it, drops


def segments_of(batch, row):
  """(segment id, start, length) of each segment in `row`, left to right."""
  seg = batch.segment_ids[row]
  ids = [k for k in np.unique(seg) if k]
  return [(k, int(np.flatnonzero(seg == k)[0]), int(np.sum(seg == k))) for k in ids]


def test_first_fit_packs_segments_into_rows():
  lengths = [10, 9, 6, 5, 12, 4, 3]
  trajs = [make_traj(length=n, seed=i, prompt_id=i) for i, n in enumerate(lengths)]
  it, drops = build(trajs)
  batch, info = next(it)
  # First fit in arrival order into 4 rows of 16: 10 -> r0, 9 -> r1, 6 -> r0 (16),
  # 5 -> r1 (14), 12 -> r2, 4 -> r2 (16), 3 -> r3.
  assert batch.tokens.shape == (4, 16)
  assert [segments_of(batch, r) for r in range(4)] == [
      [(1, 0, 10), (2, 10, 6)], [(1, 0, 9), (2, 9, 5)], [(1, 0, 12), (2, 12, 4)], [(1, 0, 3)]]
  np.testing.assert_array_equal(batch.tokens[0, 10:16], trajs[2].tokens)
  np.testing.assert_array_equal(batch.action_mask[1, 9:14], trajs[3].action_mask)
  np.testing.assert_array_equal(batch.behavior_logp[2, 12:16], trajs[5].behavior_logp)
  np.testing.assert_array_equal(batch.rewards[0, 10:16], trajs[2].rewards)
  np.testing.assert_array_equal(batch.prompt_ids[1], [1] * 9 + [3] * 5 + [-1] * 2)
  assert info.lengths.tolist() == [10, 6, 9, 5, 12, 4, 3]  # row-major segment order
  assert info.padding_rows == 0 and info.capacity == 64
  assert info.padding_fraction == pytest.approx(1 - 49 / 64)
  assert not drops
  with pytest.raises(StopIteration):
    next(it)


def test_a_batch_closes_when_the_next_unit_does_not_fit():
  # 3 rows of 16: 12, 12, 12 fill each row to 12; 7 fits nowhere and opens batch 2.
  trajs = [make_traj(length=n, seed=i) for i, n in enumerate([12, 12, 12, 7, 2])]
  it, _ = build(trajs, batch_tokens=48)
  first, info = next(it)
  assert [len(segments_of(first, r)) for r in range(3)] == [1, 1, 1]
  assert info.lengths.tolist() == [12, 12, 12]
  second, info = next(it)
  assert [segments_of(second, r) for r in range(3)] == [[(1, 0, 7), (2, 7, 2)], [], []]
  assert info.padding_rows == 2 and np.all(second.segment_ids[1:] == 0)


def test_the_trajectory_cap_closes_a_batch():
  trajs = [make_traj(length=3, seed=i) for i in range(5)]
  it, _ = build(trajs, batch_size=4)
  first, info = next(it)
  assert len(info.lengths) == 4 and first.segment_ids.max() == 4  # all in row 0
  _, info = next(it)
  assert len(info.lengths) == 1


def test_a_group_is_never_split_across_packed_batches():
  # 3 rows of 16; groups of 3. Prompt 1 (14, 14, 10) leaves 2, 2 and 6 tokens free;
  # prompt 2's first member (9) fits nowhere, so its whole group waits, although
  # its other members (4, 3) would fit.
  trajs = [make_traj(length=n, prompt_id=p, seed=s)
           for s, (n, p) in enumerate([(14, 1), (9, 2), (14, 1), (10, 1), (4, 2), (3, 2)])]
  it, _ = build(trajs, batch_tokens=48, group_size=3, batch_size=6)
  first, info = next(it)
  assert set(np.unique(first.prompt_ids)) == {-1, 1} and len(info.lengths) == 3
  second, info = next(it)
  assert set(np.unique(second.prompt_ids)) == {-1, 2} and len(info.lengths) == 3


def test_behavior_version_marks_single_version_trajectories():
  trajs = [make_traj(length=4, versions=(5, 5), seed=1), make_traj(length=5, versions=(4, 5))]
  it, _ = build(trajs)
  batch, _ = next(it)
  np.testing.assert_array_equal(batch.behavior_version[0], [5] * 4 + [-1] * 12)
  # Several versions sampled the second one: no single version, never lag-0.
  np.testing.assert_array_equal(batch.segment_ids[0, 4:9], 2)


def test_longer_than_a_row_is_dropped_as_too_long():
  it, drops = build([make_traj(length=17), make_traj(length=16, seed=1)])
  batch, _ = next(it)
  assert dict(drops) == {"too_long": 1} and batch.segment_ids[0].sum() == 16


def test_unpacked_batches_report_their_padding_fraction():
  it = pipeline.learner_pipeline(
      ListTransport([make_traj(length=6), make_traj(length=11, seed=1)]), batch_size=2,
      group_size=1, max_lag=2, buckets=(8, 16), pad_id=0, vocab_size=50,
      current_version=lambda: 5, drops=pipeline.Drops())
  batch, info = next(it)
  assert batch.shape == (2, 16) and info.capacity == 32
  assert info.padding_fraction == pytest.approx(1 - 17 / 32)
  np.testing.assert_array_equal(batch.prompt_ids[0], [0] * 6 + [-1] * 10)


@pytest.mark.parametrize("batch_tokens, row_length", [(50, 16), (64, None), (64, 1), (0, 16)])
def test_the_pipeline_checks_a_packed_shape_as_the_config_does(batch_tokens, row_length):
  """One check (`config.learner.packed_rows`) for both: the same error, word for word."""
  with pytest.raises(ValueError) as config_error:
    LearnerConfig(batch_tokens=batch_tokens, row_length=row_length).validate()
  with pytest.raises(ValueError) as pipeline_error:
    build([], batch_tokens=batch_tokens, row_length=row_length)
  assert str(pipeline_error.value) == str(config_error.value)
  assert str(config_error.value).startswith("learner.")


def test_packing_errors_name_the_fields():
  with pytest.raises(ValueError,
                     match=r"learner.batch_tokens=48 .*algorithm.group_size=4.*at least 64"):
    build([], batch_tokens=48, group_size=4)
  with pytest.raises(ValueError, match=r"learner.batch_tokens=50 .*row_length"):
    build([], batch_tokens=50)
