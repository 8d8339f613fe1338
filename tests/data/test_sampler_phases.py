"""The samplers' phases (`sao_jax.run.phases.SamplerPhases`): a partition of the sampler
loop's wall time, carried by each trajectory and summed per batch by the learner."""

import types

from sao_jax.data import pipeline
from sao_jax.run import phases as phases_lib
from sao_jax.run.metrics import batch_metrics
from sao_jax.data.sampler_phases import SAMPLER_PHASES
from sao_jax.run.phases import SAMPLER_WALL_KEY, SamplerPhases, sampler_key
from traj_factory import ListTransport, make_traj


def test_the_sampler_loop_is_split_into_phases_that_sum_to_its_wall_time():
  now = [10.0]
  engine = types.SimpleNamespace(seconds={"prefill": 0.0, "decode": 0.0})
  runner = types.SimpleNamespace(env_wait_s=0.0)
  phases = SamplerPhases(engine, runner, clock=lambda: now[0])
  now[0] += 0.25
  phases.lap("adopt")
  now[0] += 0.5
  phases.lap("start")
  # An engine step of 4 s: 1 s prefill, 2 s decode, 0.5 s waiting on environments.
  now[0] += 4.0
  engine.seconds["prefill"] += 1.0
  engine.seconds["decode"] += 2.0
  runner.env_wait_s += 0.5
  phases.lap("step")
  now[0] += 0.125  # attaching the first trajectory's info: counted in the next lap
  first = phases.take()
  assert first == {"adopt": 0.25, "start": 0.5, "prefill": 1.0, "decode": 2.0,
                   "env_wait": 0.5, "host": 0.5, "handover": 0.0, "version_wait": 0.0,
                   "wall": 4.75}
  now[0] += 1.0
  phases.lap("handover")  # the transport was full: 1.125 s since the last lap
  second = phases.take()
  assert second == {**dict.fromkeys(SAMPLER_PHASES, 0.0), "handover": 1.125, "wall": 1.125}
  # Laps: the phases partition the loop exactly.
  for report in (first, second):
    assert sum(report[p] for p in SAMPLER_PHASES) == report["wall"]


def test_the_learner_sums_a_batchs_reports_and_ignores_malformed_ones():
  good = {"adopt": 0.5, "start": 0.25, "prefill": 1.0, "decode": 2.0, "env_wait": 0.0,
          "host": 0.25, "handover": 0.0, "wall": 4.0}
  reports = [good, {**good, "decode": 3.0, "wall": 5.0},
             None,                                      # a sampler that does not report
             {"decode": 1.0},                           # no wall: nothing to share it of
             {**good, "prefill": float("nan"), "decode": -1.0, "host": True, "wall": 1.0}]
  trajs = [make_traj(seed=s, info={} if r is None else {"phases": r})
           for s, r in enumerate(reports)]
  drops = pipeline.Drops()
  batches = pipeline.learner_pipeline(ListTransport(trajs), batch_size=8, group_size=1,
                                      max_lag=2, buckets=(16,), pad_id=0, vocab_size=50,
                                      current_version=lambda: 5, drops=drops)
  _, info = next(batches)
  metrics = batch_metrics(info, drops)
  assert metrics[SAMPLER_WALL_KEY] == 4.0 + 5.0 + 1.0
  assert metrics[sampler_key("decode")] == 2.0 + 3.0  # -1 refused
  assert metrics[sampler_key("prefill")] == 1.0 + 1.0  # NaN refused
  assert metrics[sampler_key("host")] == 0.25 + 0.25  # a bool is not seconds
  assert metrics[sampler_key("adopt")] == 0.5 * 3
  # The progress line's share of each phase, largest first.
  line = phases_lib.progress_part(metrics)
  assert line == "sampler decode 50%, prefill 20%, adopt 15%"


def test_a_batch_without_reports_has_no_sampler_keys():
  drops = pipeline.Drops()
  batches = pipeline.learner_pipeline(ListTransport([make_traj()]), batch_size=1, group_size=1,
                                      max_lag=2, buckets=(16,), pad_id=0, vocab_size=50,
                                      current_version=lambda: 5, drops=drops)
  _, info = next(batches)
  assert not [k for k in batch_metrics(info, drops) if k.startswith("time/sampler/")]
