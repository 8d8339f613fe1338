"""Multi-host JAX: joining a cluster and turning per-host batch rows into global arrays.

Every host of a multi-controller JAX cluster runs the same program; each one
calls `initialize()` before any other JAX call. The cluster is described by the
environment, so one command line serves every host:

  SAO_COORDINATOR_ADDRESS=10.0.0.2:8476  host:port of process 0 (any free port)
  SAO_NUM_PROCESSES=4                    hosts in this cluster
  SAO_PROCESS_ID=0..3                    this host's index

or `SAO_COORDINATOR_ADDRESS=auto` on Cloud TPU, where `jax.distributed` reads all
three from the TPU metadata. Unset: a single host, nothing to do. A learner and
its samplers on different slices are different clusters (each with its own
coordinator); weights travel between them through `sao_jax.channel.weights_net`.

Batches: with `batch_shardings` splitting trajectories over devices of several
hosts, each host loads only the rows its devices hold (`local_rows`) and
`global_batch` assembles the global `[B, T]` arrays from every host's rows
(`jax.make_array_from_process_local_data`), so no host reads the whole batch.
Each host's pipeline picks its own length bucket and may run dry on its own, so
before every step the hosts agree (`agree_on_batch`, one tiny all-gather): all
stop if any host has no batch, else every host right-pads its rows to the
longest host's length, so they all run the step compiled for the same shape.
"""

from __future__ import annotations

import os
from typing import Mapping

import jax
import numpy as np

from sao_jax.types import Batch

# Right-padding per Batch field (tokens take the configured pad id): what the data
# pipeline puts after a row's segments, so padded positions join no segment.
_PAD = Batch(tokens=None, segment_ids=0, action_mask=0, behavior_logp=0.0, rewards=0.0,
             prompt_ids=-1, behavior_version=-1, routed_experts=-1)

ENV_ADDRESS = "SAO_COORDINATOR_ADDRESS"
ENV_PROCESSES = "SAO_NUM_PROCESSES"
ENV_ID = "SAO_PROCESS_ID"


def _cluster_size(environ: Mapping[str, str], address: str) -> tuple[int, int]:
  """(number of processes, this process's id) from the environment, checked."""
  values = []
  for name in (ENV_PROCESSES, ENV_ID):
    try:
      values.append(int(environ[name]))
    except (KeyError, ValueError):
      raise ValueError(f"{ENV_ADDRESS}={address!r} needs {name} set to an integer (got "
                       f"{environ.get(name)!r}); or set {ENV_ADDRESS}=auto on Cloud TPU") from None
  processes, process_id = values
  if not 0 <= process_id < processes:
    raise ValueError(f"{ENV_ID}={process_id} is not in [0, {ENV_PROCESSES}={processes})")
  return processes, process_id


def initialize(environ: Mapping[str, str] | None = None) -> bool:
  """Joins the cluster the environment describes (see module docstring, `join`);
  returns whether it did. Must run before any JAX computation."""
  environ = os.environ if environ is None else environ
  address = environ.get(ENV_ADDRESS, "")
  if not address:
    return False
  join(*(() if address == "auto" else (address, *_cluster_size(environ, address))))
  return True


def join(address: str | None = None, processes: int | None = None,
         process_id: int | None = None, *, heartbeat_s: int | None = None) -> None:
  """`jax.distributed.initialize` of the cluster at `address` (all None: Cloud TPU's
  metadata names it). Must run before any JAX computation.

  CPU clusters (tests, CPU-only hosts) use gloo for cross-process collectives;
  without it XLA:CPU cannot run a program whose mesh spans processes.
  `heartbeat_s` (None: jax's default, 100 s) is how long a silent process counts as
  alive: the runtime ends every process of the cluster when one is silent longer.
  """
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  extra = {} if heartbeat_s is None else {"heartbeat_timeout_seconds": int(heartbeat_s)}
  jax.distributed.initialize(address, processes, process_id, **extra)


def local_rows(sharding: jax.sharding.Sharding, global_shape: tuple[int, ...]) -> slice:
  """The rows (first dimension) of a `global_shape` array that this host's devices
  hold under `sharding`: the rows this host must load."""
  starts, stops = [], []
  for index in sharding.addressable_devices_indices_map(global_shape).values():
    start, stop, _ = index[0].indices(global_shape[0])
    starts.append(start)
    stops.append(stop)
  rows = slice(min(starts), max(stops))
  held = {range(a, b) for a, b in zip(starts, stops)}
  if sum(len(r) for r in held) < rows.stop - rows.start:
    raise ValueError(f"this host's rows {sorted((r.start, r.stop) for r in held)} of a batch of "
                     f"{global_shape[0]} are not contiguous; order the mesh's devices by host")
  return rows


def global_batch(local: Batch, shardings: Batch, batch_size: int) -> Batch:
  """Global `Batch` of `batch_size` rows from this host's rows (`local_rows` of it)."""
  def one(rows: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    rows = np.asarray(rows)
    shape = (batch_size, *rows.shape[1:])
    want = local_rows(sharding, shape)
    if rows.shape[0] != want.stop - want.start:
      raise ValueError(f"this host loaded {rows.shape[0]} rows but holds rows "
                       f"[{want.start}, {want.stop}) of the batch of {batch_size}")
    return jax.make_array_from_process_local_data(sharding, rows, shape)

  # A field the batch leaves out (None: MoE routing of a dense model) stays None.
  return jax.tree.map(lambda rows, sharding: None if rows is None else one(rows, sharding),
                      local, shardings, is_leaf=lambda x: x is None)


def agree_on_batch(length: int | None) -> int | None:
  """The padded length every host uses for this step: the longest host's `length`,
  or None (stop) when any host has no batch (`length` None). All hosts must call it."""
  from jax.experimental import multihost_utils

  mine = np.array([length is not None, length or 0], np.int32)
  every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 2)
  return int(every[:, 1].max()) if every[:, 0].all() else None


def from_first_host(data: bytes) -> bytes:
  """The first host's `data` (the same length on every host), on every host. All hosts
  call it."""
  from jax.experimental import multihost_utils

  mine = np.frombuffer(data, np.uint8)
  return np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, mine.size)[0].tobytes()


def any_host(flag: bool) -> bool:
  """Whether `flag` is set on any host (e.g. a SIGTERM one host got). All hosts call it."""
  from jax.experimental import multihost_utils

  return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).any())


def pad_length(batch: Batch, length: int, pad_id: int) -> Batch:
  """`batch` right-padded to `length` columns (padding joins no segment)."""
  extra = length - batch.shape[1]
  if extra < 0:
    raise ValueError(f"cannot pad a batch of length {batch.shape[1]} to {length}")
  if extra == 0:
    return batch
  return Batch(*[None if x is None else
                 np.pad(np.asarray(x), ((0, 0), (0, extra)) + ((0, 0),) * (np.ndim(x) - 2),
                        constant_values=pad_id if value is None else value)
                 for x, value in zip(batch, _PAD)])


def place(tree, shardings):
  """`jax.device_put(tree, shardings)`; a leaf whose sharding spans processes is
  built from this process's host copy, only the shards its own devices hold. (jax's
  device_put would first check that every process passes the same value: one
  all-gather per leaf.) Every process must pass the same values."""
  def one(leaf, sharding):
    if sharding.is_fully_addressable:
      return jax.device_put(leaf, sharding)
    host = np.asarray(leaf)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  return jax.tree.map(one, tree, shardings)
