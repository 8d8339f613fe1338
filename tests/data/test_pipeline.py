"""The grain pipeline: staleness, drops by reason, groups, padding buckets, state."""

import json

import numpy as np
import pytest

from sao_jax.data import pipeline
from traj_factory import ListTransport, make_traj


def build(trajs, *, batch_size=2, group_size=1, max_lag=2, step=5, buckets=(8, 16, 32),
          slots=None, **packing):
  drops = pipeline.Drops()
  it = pipeline.learner_pipeline(ListTransport(trajs), batch_size=batch_size,
                                 group_size=group_size, max_lag=max_lag, buckets=buckets,
                                 pad_id=0, vocab_size=50, current_version=lambda: step, drops=drops,
                                 num_prompt_slots=slots, **packing)
  return it, drops


def test_single_mode_batches_pad_to_the_smallest_bucket():
  trajs = [make_traj(length=6, versions=(4, 5), seed=1), make_traj(length=11, versions=(5, 5))]
  it, drops = build(trajs)
  batch, info = next(it)
  assert batch.tokens.shape == (2, 16)
  np.testing.assert_array_equal(batch.segment_ids.sum(1), [6, 11])
  np.testing.assert_array_equal(batch.tokens[0, :6], trajs[0].tokens)
  np.testing.assert_array_equal(batch.action_mask[1, :11], trajs[1].action_mask)
  assert batch.rewards[1, 10] == 1.0 and batch.behavior_logp[0, 6:].sum() == 0
  np.testing.assert_array_equal(info.lags, [1, 0])
  np.testing.assert_array_equal(info.version_spans, [1, 0])
  assert not drops
  with pytest.raises(StopIteration):
    next(it)


def test_drops_are_counted_by_reason_never_silent():
  bad_logp = make_traj(seed=3)
  bad_logp.behavior_logp[-1] = np.nan
  trajs = [make_traj(versions=(1, 5)),  # lag 4 > 2: stale
           make_traj(env_failure="sandbox crashed"),
           bad_logp,
           make_traj(length=40),  # longer than the largest bucket
           make_traj(seed=7), make_traj(seed=8)]
  it, drops = build(trajs)
  batch, info = next(it)
  assert dict(drops) == {"stale": 1, "env_failure": 1, "nan_logp": 1, "too_long": 1}
  assert info.padding_rows == 0 and batch.tokens.shape[0] == 2
  state = it.get_state()
  assert state["parent"]["counts"] == {"stale": 1, "env_failure": 1, "nan_logp": 1,
                                       "too_long": 1}


def test_group_mode_releases_a_group_only_when_complete():
  trajs = [make_traj(prompt_id=1, seed=1), make_traj(prompt_id=2, seed=2),
           make_traj(prompt_id=1, seed=3), make_traj(prompt_id=2, seed=4)]
  it, _ = build(trajs, batch_size=4, group_size=2)
  batch, info = next(it)
  # Prompt 1's group completed first (3rd arrival), then prompt 2's.
  np.testing.assert_array_equal(batch.prompt_ids[:, 0], [1, 1, 2, 2])
  assert info.padding_rows == 0


def test_a_group_never_splits_across_batches():
  trajs = [make_traj(prompt_id=p, seed=s) for s, p in enumerate([1, 1, 1, 2, 2, 2])]
  it, _ = build(trajs, batch_size=4, group_size=3)
  first, info = next(it)
  np.testing.assert_array_equal(first.prompt_ids[:3, 0], [1, 1, 1])
  assert info.padding_rows == 1 and first.segment_ids[3].sum() == 0
  assert np.all(first.prompt_ids[3] == -1)  # the empty row is padding: in no group
  second, _ = next(it)
  np.testing.assert_array_equal(second.prompt_ids[:3, 0], [2, 2, 2])


def test_prompt_ids_outside_the_running_mean_table_are_dropped():
  it, drops = build([make_traj(prompt_id=9), make_traj(prompt_id=1), make_traj(prompt_id=0)],
                    slots=4)
  batch, _ = next(it)
  np.testing.assert_array_equal(batch.prompt_ids[:, 0], [1, 0])
  assert drops == {"prompt_id_out_of_range": 1}


def test_ids_out_of_int32_range_are_dropped_not_a_learner_crash():
  # A forged record's prompt id or versions past int32 used to pass admission and
  # crash pack_rows with OverflowError (a learner crash from one peer record).
  trajs = [make_traj(prompt_id=2**31), make_traj(versions=(2**31, 2**31)),
           make_traj(seed=7), make_traj(seed=8)]
  it, drops = build(trajs)
  batch, _ = next(it)
  assert batch.tokens.shape[0] == 2
  assert drops == {"bad_prompt_id": 1, "bad_versions": 1}


def test_peer_failure_kinds_and_texts_cannot_grow_the_drop_counters_without_end():
  # Each record named a new failure_kind with a 1 MB failure text: a metric key on
  # every later step and a megabyte kept (and logged) per kind, without limit.
  kinds = pipeline.MAX_FAILURE_KINDS + 20
  trajs = [make_traj(env_failure="x" * (1 << 20), info={"failure_kind": f"Kind{i}"})
           for i in range(kinds)] + [make_traj(seed=7), make_traj(seed=8)]
  it, drops = build(trajs)
  next(it)
  assert drops["env_failure"] == kinds and drops["env_failure/other"] == 20
  assert len(drops) == 1 + pipeline.MAX_FAILURE_KINDS + 1
  assert max(map(len, drops.examples.values())) == pipeline.MAX_EXAMPLE_CHARS


def test_group_larger_than_batch_is_named():
  with pytest.raises(ValueError, match="group_size=8"):
    build([], batch_size=4, group_size=8)


def test_drops_keep_an_example_of_each_reason():
  it, drops = build([make_traj(env_failure="sandbox crashed"), make_traj(versions=(0, 5)),
                     make_traj(seed=1), make_traj(seed=2)])
  next(it)
  assert drops.examples == {"env_failure": "sandbox crashed", "stale": "lag 5"}


def test_a_failure_text_holding_escape_sequences_is_kept_as_one_printable_line():
  # The learner logs the example (train.py: "dropping trajectories: ..."); a failure text
  # a peer wrote, or an exception message holding policy text, reached the terminal raw:
  # an OSC 52 clipboard write, a line erased and a forged progress line.
  text = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2K\rok\nstep 1000/1000 | reward 1.000 \u202e"
  it, drops = build([make_traj(env_failure=text, info={"task": text}),
                     make_traj(seed=3, length=40, info={"task": text}),
                     make_traj(seed=1), make_traj(seed=2)])
  next(it)
  for example in (drops.examples["env_failure"], drops.examples["too_long"]):
    assert example.isprintable() and "\\x1b]52;c;" in example, example
    assert "\\nstep 1000/1000" in example and "\\u202e" in example


def test_a_record_from_a_policy_the_learner_never_made_is_dropped():
  """Versions past the learner's (a peer's forgery, or records a crashed run wrote
  after the checkpoint it resumes from) were admitted with a negative lag."""
  it, drops = build([make_traj(versions=(5, 9), seed=1), make_traj(seed=2), make_traj(seed=3)])
  batch, info = next(it)
  assert dict(drops) == {"future_version": 1}
  assert "versions (5, 9), learner at 5" in drops.examples["future_version"]
  np.testing.assert_array_equal(info.lags, [0, 0])


def test_an_unfinished_group_that_can_no_longer_train_is_let_go_not_kept_forever():
  """A group whose other members died with their sampler waited for them forever
  (and a peer could open such groups without end); once stale (or from a future
  version) it is dropped, counted, when the next group opens."""
  version = {"now": 5}
  drops = pipeline.Drops()
  trajs = [make_traj(prompt_id=1, versions=(5, 5), seed=1),  # its partner never comes
           make_traj(prompt_id=7, versions=(9, 9), seed=2),  # a future version: let go
           make_traj(prompt_id=2, versions=(8, 8), seed=3),
           make_traj(prompt_id=2, versions=(8, 8), seed=4)]
  it = pipeline.learner_pipeline(ListTransport(trajs), batch_size=2, group_size=2, max_lag=2,
                                 buckets=(16,), pad_id=0, vocab_size=50,
                                 current_version=lambda: version["now"], drops=drops)

  def take():
    version["now"] = 8  # group 1 (version 5) is stale by the time group 2 opens
    return next(it)

  batch, _ = take()
  np.testing.assert_array_equal(batch.prompt_ids[:, 0], [2, 2])
  assert dict(drops) == {"stale": 1, "future_version": 1}
  assert "an unfinished group (1 of 2 members)" in drops.examples["stale"]
  assert it.get_state()["parent"]["parent"]["parent"]["waiting"] == {}  # batch, admit, positions, group


def _resumed(trajs, consumed_state, **kwargs):
  """A fresh pipeline over what the transport still holds, restored to `consumed_state`."""
  it, _ = build(trajs, **kwargs)
  it.set_state(consumed_state)
  return it


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_unit_held_back_for_the_next_batch_survives_a_resume(packed):
  trajs = [make_traj(prompt_id=p, seed=s, length=10) for s, p in enumerate([1, 1, 1, 2, 2, 2])]
  kwargs = dict(batch_size=4, group_size=3)
  if packed:  # group 1 fills the 3 rows of 16 to 10 tokens each: group 2 waits
    kwargs.update(batch_tokens=48, row_length=16, batch_size=6)
  it, _ = build(list(trajs), **kwargs)
  next(it)  # group 1; group 2 was pulled from the transport and held back
  state = json.loads(json.dumps(it.get_state()))  # what a checkpoint stores
  second, _ = next(_resumed([], state, **kwargs))
  want, _ = next(it)
  for got_array, want_array in zip(second, want):
    np.testing.assert_array_equal(got_array, want_array)
  np.testing.assert_array_equal(np.unique(second.prompt_ids[second.prompt_ids >= 0]), [2])


def test_members_of_an_unfinished_group_survive_a_resume():
  trajs = [make_traj(prompt_id=p, seed=s) for s, p in enumerate([1, 2, 1, 2])]
  it, _ = build(trajs[:3], batch_size=2, group_size=2)
  next(it)  # group 1; prompt 2's first member waits for its partner
  state = json.loads(json.dumps(it.get_state()))
  batch, _ = next(_resumed(trajs[3:], state, batch_size=2, group_size=2))
  np.testing.assert_array_equal(batch.prompt_ids[:, 0], [2, 2])
  np.testing.assert_array_equal(batch.tokens[0, :10], trajs[1].tokens)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_a_held_back_unit_is_checked_for_staleness_again(packed):
  """docs/algorithm.md §1: the lag check holds when a trajectory is trained. Version 0
  trajectories admitted at version 4 (lag 4 = max_lag) and held back while the
  policy moves to 5 have lag 5 when the next batch takes them: dropped, counted."""
  version = {"now": 4}
  if packed:  # rows of 8: two 5-token trajectories fill both rows, the third waits
    trajs = [make_traj(length=5, versions=(0, 0), seed=s) for s in range(3)]
    kwargs = dict(batch_size=8, group_size=1, batch_tokens=16, row_length=8)
  else:  # groups of 3 in batches of 4: the second group waits
    trajs = [make_traj(length=5, versions=(0, 0), prompt_id=p, seed=s)
             for s, p in enumerate([1, 1, 1, 2, 2, 2])]
    kwargs = dict(batch_size=4, group_size=3)
  fresh = [make_traj(length=5, versions=(4, 4), prompt_id=3, seed=10 + s)
           for s in range(kwargs["group_size"])]
  drops = pipeline.Drops()
  it = pipeline.learner_pipeline(ListTransport(trajs + fresh), max_lag=4, buckets=(8,),
                                 pad_id=0, vocab_size=50, current_version=lambda: version["now"],
                                 drops=drops, **kwargs)
  _, info = next(it)
  np.testing.assert_array_equal(info.lags, [4] * (2 if packed else 3))
  version["now"] = 5  # a policy update
  batch, info = next(it)
  np.testing.assert_array_equal(info.lags, [1] * len(fresh))
  assert dict(drops) == {"stale": 1 if packed else 3} and drops.examples["stale"] == "lag 5"
  assert set(np.unique(batch.prompt_ids)) == {-1, 3}


def test_batch_info_carries_why_episodes_ended_and_the_metrics_count_them():
  from sao_jax.run.metrics import batch_metrics
  ends = [("answer", "stop_token"), ("max_turns", "stop_pattern"), ("truncated", "max_seq_len"),
          ("answer", "max_new_tokens")]
  trajs = [make_traj(seed=s, info={"end": end, "last_turn_end": last})
           for s, (end, last) in enumerate(ends)]
  it, drops = build(trajs, batch_size=4)
  _, info = next(it)
  assert info.ends == tuple(ends)
  metrics = batch_metrics(info, drops)
  assert metrics["episodes/max_turns_frac"] == 0.25
  assert metrics["episodes/length_cut_frac"] == 0.5  # out of context; last turn cut at max_new_tokens


def test_the_metrics_count_episodes_that_ran_a_tool_whatever_a_peer_wrote():
  """`episodes/tool_call_frac`: episodes with `info["tool_calls"]` > 0. A missing,
  negative, boolean or non-integer count (a peer's record) counts as no tool."""
  from sao_jax.run.metrics import batch_metrics
  counts = [2, 0, 1, None, -3, True, "7", 1.5]
  trajs = [make_traj(seed=s, info={} if c is None else {"tool_calls": c})
           for s, c in enumerate(counts)]
  it, drops = build(trajs, batch_size=8)
  _, info = next(it)
  assert info.tool_calls == (2, 0, 1, 0, 0, 0, 0, 0)
  assert batch_metrics(info, drops)["episodes/tool_call_frac"] == 0.25


def test_the_metrics_sum_the_weight_channel_counts_the_samplers_report():
  """`weights/sampler_waits` and `weights/sampler_errors`: the network faults and peer
  errors each trajectory's sampler counted since its previous one (`sampler.worker`);
  a peer's malformed or huge count adds nothing, or at most `_MAX_COUNT`."""
  from sao_jax.run.metrics import batch_metrics
  counts = [(2, 0), (0, 1), (None, None), (-1, True), (10 ** 400, "3")]
  trajs = [make_traj(seed=s, info={} if w is None else {"weight_waits": w, "weight_errors": e})
           for s, (w, e) in enumerate(counts)]
  it, drops = build(trajs, batch_size=8)
  _, info = next(it)
  assert info.weight_waits == (2, 0, 0, 0, pipeline._MAX_COUNT)
  metrics = batch_metrics(info, drops)
  assert metrics["weights/sampler_waits"] == 2.0 + pipeline._MAX_COUNT
  assert metrics["weights/sampler_errors"] == 1.0


def test_the_staleness_histogram_has_a_fixed_set_of_keys_whatever_the_lags():
  """Before: one `staleness/lag_k` key for every k up to the largest lag in the batch, so
  with a large data.max_lag, records claiming an old first version (a peer's, or just a
  slow sampler) added thousands of keys to every metrics row and TensorBoard."""
  from sao_jax.run.metrics import LAG_KEYS, batch_metrics
  trajs = [make_traj(seed=s, versions=(v, 10_000)) for s, v in enumerate((10_000, 9_999, 0))]
  it, drops = build(trajs, batch_size=3, max_lag=100_000, step=10_000)
  _, info = next(it)
  metrics = batch_metrics(info, drops)
  lag_keys = {k for k in metrics if k.startswith("staleness/lag_")}
  assert lag_keys == {f"staleness/lag_{k}" for k in range(LAG_KEYS)} | {
      f"staleness/lag_{LAG_KEYS}_plus"}
  assert metrics["staleness/lag_0"] == metrics["staleness/lag_1"] == 1
  assert metrics[f"staleness/lag_{LAG_KEYS}_plus"] == 1 and metrics["staleness/max"] == 10_000
  assert sum(metrics[k] for k in lag_keys) == 3  # experiments.runs counts trained trajectories


def test_the_metrics_break_rewards_down_by_data_source_and_average_episode_metrics():
  """`reward/source/<source>`: mean outcome of the batch's episodes of that source
  (verl's data_source); `episodes/metric/<name>`: mean of what the environment or
  reward function reported. What a peer wrote that is not a short label or a finite
  number is ignored."""
  from sao_jax.run.metrics import batch_metrics
  infos = [({"source": "gsm8k", "metrics": {"length": 3}}, 1.0),
           ({"source": "gsm8k", "metrics": {"length": 5, "bad": "x"}}, 0.0),
           ({"source": "math", "metrics": {"length": float("nan")}}, 1.0),
           ({"source": "x" * 65, "metrics": "junk"}, 1.0)]
  trajs = [make_traj(seed=s, info=info, outcome=r) for s, (info, r) in enumerate(infos)]
  it, drops = build(trajs, batch_size=4)
  _, info = next(it)
  assert info.sources == ("gsm8k", "gsm8k", "math", "")
  metrics = batch_metrics(info, drops)
  assert metrics["reward/source/gsm8k"] == 0.5 and metrics["reward/source/math"] == 1.0
  assert metrics["episodes/metric/length"] == 4.0
  assert not any(key.endswith("/bad") or "xxx" in key for key in metrics)


def test_group_release_delay_is_first_to_last_member_of_each_group():
  """Members reach the learner at the times listed: group 3 opens at 10 and completes
  at 14 (delay 4), group 4 opens at 11 and completes at 12 (delay 1); a sampler's own
  `group_release_s` is not believed."""
  arrivals = iter([10.0, 11.0, 12.0, 14.0])
  now = {"t": 0.0}

  class TimedTransport(ListTransport):
    def get(self, timeout=0.0):
      traj = super().get(timeout)
      if traj is not None:
        now["t"] = next(arrivals)
      return traj

  forged = make_traj(prompt_id=3, seed=1)
  forged.info["group_release_s"] = 1e9
  trajs = [forged, make_traj(prompt_id=4, seed=2), make_traj(prompt_id=4, seed=3),
           make_traj(prompt_id=3, seed=4)]
  it = pipeline.learner_pipeline(TimedTransport(trajs), batch_size=4, group_size=2, max_lag=2,
                                 buckets=(16,), pad_id=0, vocab_size=50, current_version=lambda: 5,
                                 drops=pipeline.Drops(), clock=lambda: now["t"])
  _, info = next(it)
  assert sorted(info.group_release_s) == [1.0, 4.0]


def test_single_mode_has_no_group_release_delay():
  traj = make_traj(seed=1)
  traj.info["group_release_s"] = 5.0  # a peer's claim
  it, _ = build([traj, make_traj(seed=2)])
  _, info = next(it)
  assert info.group_release_s == ()


def test_batch_metrics_report_release_delays_trajectories_and_stale_drops_from_the_start():
  from sao_jax.run.metrics import batch_metrics  # pylint: disable=import-outside-toplevel

  info = pipeline.BatchInfo(lags=np.array([0, 1, 0]), version_spans=np.zeros(3),
                            lengths=np.array([4, 4, 4]), padding_rows=0, capacity=12,
                            group_release_s=(1.0, 4.0))
  out = batch_metrics(info, pipeline.Drops())
  assert out["groups/release_delay_s"] == 2.5 and out["groups/release_delay_max_s"] == 4.0
  assert out["batch/trajectories"] == 3.0
  assert out["dropped/stale"] == 0.0  # the column exists before the first stale drop
