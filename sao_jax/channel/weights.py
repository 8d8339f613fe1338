"""`WeightChannel`: versioned policy weights from the learner to sampler processes.

The learner `publish(params, version)`es after policy updates; a sampler `poll()`s
between decode steps and adopts the newest version it finds (docs/algorithm.md §1: it never
waits for the learner). Three backends (`sampler.weights`), each a publisher
plus a picklable subscriber spec that a sampler process turns into a subscriber:

- `SharedMemoryWeights` (same host): the parameter tree's layout (paths, shapes,
  dtypes, byte offsets) is fixed once; values travel through a
  `multiprocessing.shared_memory` block with two slots (double buffering), each
  guarded by a sequence counter (odd while being written). A reader copies the
  newest complete slot and re-checks its counter, so it never returns a torn
  mix of two versions, and no parameter tree is pickled per update. The block
  is named `sao_w<owner pid>_<random>`; a learner killed before `close()`
  leaves it in /dev/shm, and the next publisher created on the host unlinks
  every such block whose owner is dead (`reclaim_stale_blocks`). Samplers
  still attached keep their mapping; they die with that learner anyway.
  Publishers given another `block_prefix` create and reclaim only the blocks
  of that prefix (tests running side by side each use their own).
- `DirectoryWeights` (many hosts, `weights_directory`): each version is an orbax
  checkpoint in a shared directory or bucket (written to a temporary name,
  renamed when complete), signed by every learner host (`weights_digest`);
  subscribers restore the newest one and check the arrays they restored
  against the signatures before they use them.
- `NetworkWeights` (`weights_net`, learner and samplers on different JAX
  clusters): every learner host serves its shards over TCP; subscribers
  (`weights_fetch`) fetch from every host, verify checksums and assemble the arrays on host.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from multiprocessing import shared_memory
from typing import Any

import jax
import numpy as np

from sao_jax import owner as process_owner
from sao_jax.channel import run_secret
from sao_jax.channel import weights_fetch, weights_net
from sao_jax.channel.weights_directory import DirectorySpec, DirectorySubscriber, DirectoryWeights
from sao_jax.config import SamplerConfig
from sao_jax.storage import storage_path

_HEADER_WORDS = 8  # [latest_slot, version_0, version_1, seq_0, seq_1, ...]
_HEADER_BYTES = _HEADER_WORDS * 8
BLOCK_PREFIX = "sao_w"  # + owner pid + "_" + random hex; short: macOS allows 31 chars
SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory


@dataclasses.dataclass(frozen=True)
class _Leaf:
  shape: tuple[int, ...]
  dtype: np.dtype  # a dtype object: its `.str` would lose bfloat16 ('<V2')
  offset: int
  nbytes: int


def _layout(template: Any) -> tuple[jax.tree_util.PyTreeDef, list[_Leaf], int]:
  leaves, treedef = jax.tree.flatten(template)
  layout, offset = [], 0
  for leaf in leaves:
    dtype = np.dtype(leaf.dtype)
    nbytes = int(np.prod(leaf.shape, dtype=np.int64)) * dtype.itemsize
    offset = -(-offset // 64) * 64  # 64-byte aligned leaves
    layout.append(_Leaf(tuple(leaf.shape), dtype, offset, nbytes))
    offset += nbytes
  return treedef, layout, -(-offset // 64) * 64


def _block_owner(name: str, prefix: str) -> int | None:
  """The pid in a weight block's name, or None if `name` is not a block of `prefix`."""
  if not name.startswith(prefix):
    return None
  pid, sep, token = name[len(prefix):].partition("_")
  return int(pid) if sep and pid.isdigit() and token else None


def reclaim_stale_blocks(directory: str = SHM_DIR, prefix: str = BLOCK_PREFIX) -> list[str]:
  """Unlinks the weight blocks of `prefix` in `directory` whose owner process is gone (a
  learner killed before `close()`); returns their names. A live owner's block
  (pid reuse included) is kept. Without the directory (not Linux) nothing is done.
  Owners are looked up in this PID namespace: containers that share one /dev/shm
  must share their PID namespace too, or a live learner's block looks stale."""
  try:
    names = os.listdir(directory)
  except FileNotFoundError:
    return []
  reclaimed = []
  for name in sorted(names):
    owner = _block_owner(name, prefix)
    if owner is not None and not process_owner.running(owner):
      try:
        os.unlink(os.path.join(directory, name))
        reclaimed.append(name)
      except FileNotFoundError:  # another publisher reclaimed it first
        pass
  return reclaimed


@dataclasses.dataclass(frozen=True)
class SharedMemorySpec:
  """What a subscriber process needs to attach: picklable, no arrays."""

  name: str
  treedef: jax.tree_util.PyTreeDef
  layout: tuple[_Leaf, ...]
  slot_bytes: int


class SharedMemoryWeights:
  """Publisher side; owns the shared-memory block (`close()` unlinks it).

  Creating one first reclaims the blocks of dead learners on this host that
  carry its `block_prefix` (`reclaimed` names them).
  """

  def __init__(self, template: Any, block_prefix: str = BLOCK_PREFIX):
    treedef, layout, slot_bytes = _layout(template)
    self.reclaimed = reclaim_stale_blocks(prefix=block_prefix)
    self._shm = shared_memory.SharedMemory(
        name=f"{block_prefix}{os.getpid()}_{secrets.token_hex(4)}", create=True,
        size=_HEADER_BYTES + 2 * slot_bytes)
    self._header = np.ndarray((_HEADER_WORDS,), np.int64, self._shm.buf[:_HEADER_BYTES])
    self._header[:] = 0
    self._header[1:3] = -1  # no version in either slot yet
    self.spec = SharedMemorySpec(self._shm.name, treedef, tuple(layout), slot_bytes)

  def publish(self, params: Any, version: int) -> None:
    leaves = jax.tree.leaves(jax.device_get(params))  # one batched copy of device arrays
    if len(leaves) != len(self.spec.layout):
      raise ValueError(f"publish: params have {len(leaves)} leaves, the channel was built for "
                       f"{len(self.spec.layout)}; build a new channel for a new model")
    slot = 1 - int(self._header[0]) if self._header[1 + int(self._header[0])] >= 0 else 0
    base = _HEADER_BYTES + slot * self.spec.slot_bytes
    self._header[3 + slot] += 1  # odd: being written
    for leaf, value in zip(self.spec.layout, leaves):
      host = np.asarray(value)
      if host.shape != leaf.shape or host.dtype != leaf.dtype:
        raise ValueError(f"publish: leaf of shape {host.shape} {host.dtype} does not match the "
                         f"channel layout {leaf.shape} {leaf.dtype}")
      target = np.ndarray(leaf.shape, leaf.dtype, self._shm.buf, base + leaf.offset)
      target[...] = host
    self._header[1 + slot] = version
    self._header[3 + slot] += 1  # even: complete
    self._header[0] = slot

  def close(self) -> None:
    del self._header
    self._shm.close()
    self._shm.unlink()


class SharedMemorySubscriber:
  """Sampler side: `poll()` returns (host params, version) when a newer version exists."""

  def __init__(self, spec: SharedMemorySpec):
    self._spec = spec
    self._shm = shared_memory.SharedMemory(name=spec.name)
    self._header = np.ndarray((_HEADER_WORDS,), np.int64, self._shm.buf[:_HEADER_BYTES])
    self.version = -1

  def poll(self) -> tuple[Any, int] | None:
    for _ in range(100):  # retry if the slot is overwritten while we copy it
      slot = int(self._header[0])
      seq = int(self._header[3 + slot])
      version = int(self._header[1 + slot])
      if version <= self.version:
        return None
      if seq % 2:
        time.sleep(0.001)
        continue
      base = _HEADER_BYTES + slot * self._spec.slot_bytes
      leaves = [np.ndarray(leaf.shape, leaf.dtype, self._shm.buf, base + leaf.offset).copy()
                for leaf in self._spec.layout]
      if int(self._header[3 + slot]) == seq:
        self.version = version
        return jax.tree.unflatten(self._spec.treedef, leaves), version
    raise RuntimeError(f"weight channel {self._spec.name}: could not read a consistent version")

  def close(self) -> None:
    del self._header
    self._shm.close()


def make_publisher(cfg: SamplerConfig, template: Any, secret: bytes | None = None):
  """The publisher `cfg.weights` selects for params shaped like `template`; a directory
  signs its versions with `secret` (the run's, `run_secret.for_run`).

  Only "network" (or "directory") can publish from a learner of several hosts:
  the shared-memory block would hold one host's shards.
  """
  if cfg.weights == "shared_memory":
    if jax.process_count() > 1:
      raise ValueError(f"sampler.weights='shared_memory' cannot publish from a learner of "
                       f"{jax.process_count()} hosts; use sampler.weights='network'")
    return SharedMemoryWeights(template)
  if cfg.weights == "directory":
    return DirectoryWeights(cfg.weights_dir, template, secret)
  return weights_net.from_config(cfg, template)


def remote_spec(cfg: SamplerConfig, template: Any):
  """The spec a sampler on another host (`sao-sampler`) subscribes with to the
  channel `cfg.weights` names: the learner hosts' network servers or the shared
  directory (shared memory reaches only the learner's own processes)."""
  if cfg.weights == "network":
    return weights_fetch.NetworkSpec(tuple(cfg.weights_addresses), template,
                                   secret=run_secret.load_secret(cfg))
  if cfg.weights == "directory":
    secret = run_secret.load_secret(cfg)
    if secret is None:
      raise ValueError("sampler.weights='directory' for a sampler on another host checks the "
                       "learner's signatures with the run's secret: set "
                       "sampler.weights_secret_file (or weights_secret_env), the same as the "
                       f"learner's (create one with `{run_secret.CREATE_HINT}`)")
    return DirectorySpec(str(storage_path(cfg.weights_dir)), template, secret=secret)
  raise ValueError(f"sampler.weights={cfg.weights!r} cannot reach a sampler on another host; "
                   "set sampler.weights='network' or 'directory'")


def subscribe(spec: SharedMemorySpec | DirectorySpec | weights_fetch.NetworkSpec):
  """The subscriber for a publisher's `spec` (called inside the sampler process)."""
  if isinstance(spec, SharedMemorySpec):
    return SharedMemorySubscriber(spec)
  if isinstance(spec, weights_fetch.NetworkSpec):
    return weights_fetch.NetworkSubscriber(spec)
  return DirectorySubscriber(spec)
