"""The learner's data path, built from the config: its end of the transport and
its share of every batch.

    transport = learner_transport(cfg, drops, secret)   # queue, or this host's directory shard
    batches   = learner_batches(cfg, transport, current_version=..., drops=...)

Multi-host learner: every host builds the pipeline for its share of each batch
(`local_batch_sizes`) and reads a disjoint part of the directory transport
(shard = (process index, process count), whole GRPO groups per shard); the
learner loop assembles the global batch.
"""

from __future__ import annotations

import secrets
from typing import Callable, Iterator

import jax

from sao_jax.channel import sealed
from sao_jax.channel.transport import DirectoryTransport, QueueTransport
from sao_jax.config import Config
from sao_jax.data import fixed_lag, pipeline
from sao_jax.data.failures import Intake
from sao_jax.data.task_positions import TaskPositions
from sao_jax.sharding import distributed


def learner_transport(cfg: Config, drops: pipeline.Drops, secret: bytes):
  """The learner's end of the transport. A directory is partitioned between the
  learner hosts, sealed with the run's `secret` (`run_secret.for_run`: the configured
  one, else a fresh one that same-host samplers inherit) and started as a new run,
  whose nonce the first host draws and announces. Records it quarantines are counted
  in `drops`."""
  if cfg.data.transport == "queue":
    if jax.process_count() > 1:
      raise ValueError(f"data.transport='queue' cannot feed a learner of {jax.process_count()} "
                       "hosts; use data.transport='directory'")
    return QueueTransport(cfg.data.transport_capacity, drops=drops)
  nonce = secrets.token_bytes(sealed.NONCE_BYTES)
  if jax.process_count() > 1:  # every host seals and reads for the first host's run
    nonce = distributed.from_first_host(nonce)
  transport = DirectoryTransport(
      cfg.data.transport_dir, cfg.data.transport_capacity, max_tokens=cfg.sampler.max_seq_len,
      secret=secret, shard=(jax.process_index(), jax.process_count()),
      by_prompt=cfg.algorithm.group_size > 1, drops=drops)
  transport.start_run(nonce, announce=jax.process_index() == 0)
  return transport


def local_batch_sizes(cfg: Config, hosts: int) -> tuple[int, int | None]:
  """(trajectories, packed tokens or None) of one learner host's share of a batch:
  each of `hosts` hosts loads `learner.batch_rows / hosts` rows."""
  learner = cfg.learner
  if learner.batch_rows % hosts:
    raise ValueError(f"learner.batch_rows={learner.batch_rows} (rows per batch) must be a "
                     f"multiple of the {hosts} learner hosts: each host loads an equal share")
  trajectories = learner.batch_trajectories // hosts
  if learner.batch_trajectories % hosts or trajectories % cfg.algorithm.group_size:
    raise ValueError(f"learner.batch_trajectories={learner.batch_trajectories} must split "
                     f"into {hosts} host shares of whole groups of algorithm.group_size="
                     f"{cfg.algorithm.group_size}")
  if learner.batch_tokens is None:
    return trajectories, None
  return trajectories, learner.batch_rows // hosts * learner.row_length


def learner_batches(cfg: Config, transport, *, current_version: Callable[[], int],
                    drops: pipeline.Drops, intake: Intake | None = None,
                    while_waiting: Callable[[], None] = lambda: None,
                    on_poll: Callable[[], None] = lambda: None,
                    interrupted: Callable[[], bool] = lambda: False,
                    positions: TaskPositions | None = None) -> Iterator:
  """This host's (Batch, BatchInfo) stream (`pipeline.learner_pipeline`) as the
  config says: its share of each batch, staleness against `current_version()`,
  drops counted in `drops`, every judged trajectory told to `intake` (the failure
  bound, `data.failures`), the tasks that reached it recorded in `positions`;
  `while_waiting()` runs at every empty poll of the transport (e.g. to restart
  samplers that died before sending anything), `on_poll()` at every poll (e.g. to
  report what the learner waits for); once `interrupted()` (SIGTERM) the stream raises
  `pipeline.Interrupted` at its next poll instead of waiting on. With `data.fixed_lag` the stream is
  `fixed_lag.ScheduledBatches` (batches by schedule, not by arrival; `positions` unused:
  a restarted sampler could not sample its batches again, `SamplerSupervisor` refuses)."""
  batch_size, batch_tokens = local_batch_sizes(cfg, jax.process_count())
  running_mean = cfg.algorithm.spec.advantage == "running_mean"
  if cfg.data.fixed_lag is not None:  # batches by schedule, not by arrival
    if jax.process_count() > 1:
      raise ValueError(f"data.fixed_lag={cfg.data.fixed_lag} schedules the batches of a learner "
                       f"on one host, and this one spans {jax.process_count()}; set "
                       "data.fixed_lag=None")
    return fixed_lag.ScheduledBatches(
        transport, fixed_lag.Schedule.of(cfg), batch_size=batch_size,
        buckets=cfg.data.length_buckets, pad_id=cfg.data.pad_id,
        vocab_size=cfg.model.vocab_size, max_lag=cfg.data.max_lag,
        current_version=current_version, drops=drops, intake=intake,
        num_prompt_slots=cfg.algorithm.running_mean_slots if running_mean else None,
        should_stop=lambda: while_waiting() or False, on_poll=on_poll, interrupted=interrupted)
  return pipeline.learner_pipeline(
      transport, batch_size=batch_size, group_size=cfg.algorithm.group_size,
      max_lag=cfg.data.max_lag, buckets=cfg.data.length_buckets, pad_id=cfg.data.pad_id,
      vocab_size=cfg.model.vocab_size, current_version=current_version, drops=drops,
      num_prompt_slots=cfg.algorithm.running_mean_slots if running_mean else None,
      batch_tokens=batch_tokens, row_length=cfg.learner.row_length,
      should_stop=lambda: while_waiting() or False, on_poll=on_poll, interrupted=interrupted,
      intake=intake,
      positions=positions)


class Checkpointed:
  """`batches` with each item passed through `fn`, and the pipeline's `get_state` /
  `set_state` (what `learner.loop` checkpoints: its held units and the task positions
  of `task_positions`) on a learner of one host. On several, none: orbax writes the
  checkpoint's data item from the first host only, and its held trajectories restored
  on every host would be trained once per host."""

  def __init__(self, batches, fn: Callable):
    self._batches, self._fn = batches, fn
    if jax.process_count() == 1:
      self.get_state, self.set_state = batches.get_state, batches.set_state

  def __iter__(self):
    return self

  def __next__(self):
    return self._fn(next(self._batches))
