"""`Trajectory`: one finished rollout on the host, its validation and its bytes.

A trajectory is one token sequence `x[0..T)` with per-token arrays aligned to
it (index t belongs to token t, docs/algorithm.md §1) and per-trajectory metadata. It is
what the sampler hands to the transport and what the learner's pipeline pads
into a `Batch`.

`problems(traj, vocab_size)` names everything that would make a trajectory
unsafe to train on (wrong shapes, non-finite values, no action token, rewards or
log-probs off the action mask, token ids out of range, a prompt id or policy
versions outside [0, 2**31) that the int32 batch cannot hold); the pipeline rejects such
trajectories with the reason counted, so they never reach the loss.

`to_bytes` / `from_bytes` give a compact, pickle-free encoding (an `.npz`
archive) for record files that cross hosts. `from_bytes` treats its input as
untrusted: it accepts only the archive `to_bytes` writes (the five members,
stored or deflated, 1-D arrays of the expected kinds, metadata of the expected
types, and for an MoE policy a sixth), never decompresses more than
`max_record_bytes(max_tokens)` (a trajectory holds at most `sampler.max_seq_len`
tokens), and raises `RecordError` with a short `reason` ('unreadable',
'oversized', 'malformed') for anything else.

MoE routing (`routed_experts.npy`, only in records of MoE policies): a
[T, L, k] int8 or int16 array (`moe.expert_index_dtype`: int8 up to 127 experts)
holding, for token t and MoE layer l, the k experts the sampler routed the token
to, -1 where it recorded none. L x k is at most `MAX_ROUTED_PER_TOKEN`, so the
member is bounded by 2 x MAX_ROUTED_PER_TOKEN bytes per token; what a record of a
given model costs is L x k x itemsize bytes per token (docs/explanation/moe-routing.md
gives Qwen3-30B-A3B's).
"""

from __future__ import annotations

import io
import json
import math
import zipfile
import zlib

import numpy as np

from sao_jax import bounded_json
from sao_jax.types import Trajectory

ARRAYS = ("tokens", "action_mask", "behavior_logp", "rewards")
ROUTING = "routed_experts"  # the optional member of MoE policies' records
# Most recorded experts per token (MoE layers x top-k): 752 for Qwen3-235B-A22B, 384
# for Qwen3-30B-A3B; a larger model raises it.
MAX_ROUTED_PER_TOKEN = 1024
_ROUTING_ITEMSIZE = 2  # int16 at most (`moe.expert_index_dtype`)
# The dtype kinds each array may have (integers for ids and the mask, floats for the rest).
_KINDS = {"tokens": "iu", "action_mask": "iub", "behavior_logp": "f", "rewards": "f"}
_MAX_ITEMSIZE = 8  # bytes per element of any array
_NPY_HEADER_BYTES = 4096  # an .npy member's magic and header (numpy writes ~128)
_META_BYTES = 1 << 20  # the JSON metadata: ids, versions, an env failure text, small info
_META_DEPTH = 16
_ZIP_OVERHEAD = 4096  # local and central directory entries of five members
# The batch holds prompt ids and policy versions as int32 (`sao_jax.types.Batch`);
# both are counts or slots, never negative.
_MAX_ID = int(np.iinfo(np.int32).max)


def problems(traj: Trajectory, vocab_size: int | None = None) -> list[str]:
  """Reasons `traj` must not be trained on (empty if it is fine). Reason strings
  are short stable keys used as drop counters, e.g. 'nan_logp'."""
  arrays = [np.asarray(getattr(traj, name)) for name in ARRAYS]
  if any(a.ndim != 1 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
    return ["bad_shape"]
  if traj.length == 0:
    return ["empty"]
  found = []
  action = traj.action_mask.astype(bool)
  if not action.any():
    found.append("no_action_tokens")
  if not np.all(np.isin(traj.action_mask, (0, 1))):
    found.append("bad_action_mask")
  if not np.all(np.isfinite(traj.behavior_logp)):
    found.append("nan_logp")
  elif np.any(traj.behavior_logp[action] > 1e-6) or np.any(traj.behavior_logp[~action] != 0):
    found.append("bad_logp")
  if not np.all(np.isfinite(traj.rewards)):
    found.append("nan_reward")
  elif np.any(traj.rewards[~action] != 0):
    found.append("reward_off_action")
  if vocab_size is not None and (traj.tokens.min() < 0 or traj.tokens.max() >= vocab_size):
    found.append("token_out_of_range")
  if not 0 <= traj.prompt_id <= _MAX_ID:
    found.append("bad_prompt_id")
  if not 0 <= traj.policy_versions[0] <= traj.policy_versions[1] <= _MAX_ID:
    found.append("bad_versions")
  if traj.routed_experts is not None:
    routed = np.asarray(traj.routed_experts)
    if (routed.ndim != 3 or routed.shape[0] != traj.length or routed.dtype.kind != "i"
        or routed.dtype.itemsize > _ROUTING_ITEMSIZE
        or routed.shape[1] * routed.shape[2] > MAX_ROUTED_PER_TOKEN
        or (routed.size and routed.min() < -1)):
      found.append("bad_routing")
  return found


def to_bytes(traj: Trajectory) -> bytes:
  meta = {"prompt_id": int(traj.prompt_id), "policy_versions": list(traj.policy_versions),
          "env_failure": traj.env_failure, "info": traj.info}
  arrays = {name: np.asarray(getattr(traj, name)) for name in ARRAYS}
  if traj.routed_experts is not None:
    arrays[ROUTING] = np.asarray(traj.routed_experts)
  buffer = io.BytesIO()
  np.savez(buffer, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
  return buffer.getvalue()


class RecordError(ValueError):
  """Bytes that are not a record `to_bytes` could have written; `reason` is a drop key."""

  def __init__(self, reason: str, detail: str):
    super().__init__(f"{reason}: {detail}")
    self.reason = reason


def _member_bytes(max_tokens: int) -> int:
  return _NPY_HEADER_BYTES + _MAX_ITEMSIZE * max_tokens


def _routing_bytes(max_tokens: int) -> int:
  return _NPY_HEADER_BYTES + _ROUTING_ITEMSIZE * MAX_ROUTED_PER_TOKEN * max_tokens


def max_record_bytes(max_tokens: int) -> int:
  """Most bytes a record of a trajectory of at most `max_tokens` tokens can take,
  decompressed or not: four arrays of <= 8-byte elements, the routing of an MoE
  policy, the metadata, zip framing."""
  return (len(ARRAYS) * _member_bytes(max_tokens) + _routing_bytes(max_tokens)
          + _NPY_HEADER_BYTES + _META_BYTES + _ZIP_OVERHEAD)


def _read_npy(raw: bytes, name: str, kinds: str, max_length: int, ndim: int = 1,
              max_itemsize: int = _MAX_ITEMSIZE, max_row: int = 1) -> np.ndarray:
  """The `ndim`-D array an .npy member holds (at most `max_length` rows of at most
  `max_row` elements each), checked before any allocation."""
  stream = io.BytesIO(raw)
  try:
    version = np.lib.format.read_magic(stream)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read_header is None:
      raise RecordError("malformed", f"{name}: .npy format version {version}")
    shape, _, dtype = read_header(stream, max_header_size=_NPY_HEADER_BYTES)
  except RecordError:
    raise
  except (ValueError, SyntaxError, TypeError) as error:  # bad magic, header or dtype
    raise RecordError("malformed", f"{name}: not an .npy array ({error})") from None
  if dtype.hasobject or dtype.kind not in kinds or dtype.itemsize > max_itemsize or (
      len(shape) != ndim):
    raise RecordError("malformed", f"{name}: a {dtype} array of shape {shape}; expected "
                                   f"{ndim}-D of kind {kinds!r}, <= {max_itemsize} bytes each")
  row = math.prod(shape[1:])
  if shape[0] > max_length:
    raise RecordError("oversized", f"{name}: {shape[0]} elements, more than {max_length}")
  if row > max_row:
    raise RecordError("oversized", f"{name}: {row} elements per token, more than {max_row}")
  count = shape[0] * row
  if len(raw) - stream.tell() != count * dtype.itemsize:
    raise RecordError("malformed", f"{name}: {len(raw) - stream.tell()} data bytes for "
                                   f"{shape} x {dtype}")
  return np.frombuffer(raw, dtype, count=count, offset=stream.tell()).reshape(shape).copy()


def _members(data: bytes, max_tokens: int) -> dict[str, bytes]:
  """Each member's bytes, decompressed with a cap (zipfile stops at the declared size)."""
  expected = {f"{name}.npy" for name in ("meta",) + ARRAYS}
  try:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
      infos = archive.infolist()
      names = [info.filename for info in infos]
      if sorted(set(names) - {f"{ROUTING}.npy"}) != sorted(expected) or (
          len(names) != len(set(names))):
        raise RecordError("malformed", f"members {names[:8]}; expected {sorted(expected)} "
                                       f"and optionally {ROUTING}.npy")
      members = {}
      for info in infos:
        cap = {"meta.npy": _NPY_HEADER_BYTES + _META_BYTES,
               f"{ROUTING}.npy": _routing_bytes(max_tokens)}.get(
                   info.filename, _member_bytes(max_tokens))
        # bzip2 and lzma members decompress without a cap inside zipfile.
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
          raise RecordError("malformed", f"{info.filename}: compression {info.compress_type}")
        if info.file_size > cap:
          raise RecordError("oversized", f"{info.filename}: {info.file_size} bytes, more than "
                                         f"the {cap} a {max_tokens}-token trajectory needs")
        with archive.open(info) as member:
          members[info.filename[:-len(".npy")]] = member.read(cap + 1)
  except RecordError:
    raise
  except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError, NotImplementedError,
          ValueError) as error:  # truncated, garbage, bad CRC, encrypted
    raise RecordError("unreadable", f"not a record archive ({error})") from None
  return members


def from_bytes(data: bytes, *, max_tokens: int | None = None) -> Trajectory:
  """The trajectory `to_bytes` encoded; `RecordError` for anything else (module docstring).
  Without `max_tokens` (this process's own bytes, e.g. checkpointed pipeline state) an
  array may hold as many elements as `data` has bytes."""
  max_tokens = len(data) if max_tokens is None else max_tokens
  if len(data) > max_record_bytes(max_tokens):
    raise RecordError("oversized", f"{len(data)} bytes, more than the "
                                   f"{max_record_bytes(max_tokens)} of a {max_tokens}-token record")
  members = _members(data, max_tokens)
  arrays = {name: _read_npy(members[name], name, _KINDS[name], max_tokens) for name in ARRAYS}
  meta_bytes = _read_npy(members["meta"], "meta", "u", _META_BYTES)
  if meta_bytes.dtype != np.uint8:
    raise RecordError("malformed", f"meta: {meta_bytes.dtype} instead of uint8")
  try:
    meta = bounded_json.loads(meta_bytes.tobytes(), max_bytes=_META_BYTES,
                              max_depth=_META_DEPTH, what="record metadata")
  except ValueError as error:
    raise RecordError("malformed", str(error)) from None
  if not isinstance(meta, dict) or set(meta) != {"prompt_id", "policy_versions", "env_failure",
                                                 "info"}:
    raise RecordError("malformed", f"metadata {str(meta)[:100]}")
  versions = meta["policy_versions"]
  if (not _is_int(meta["prompt_id"]) or not isinstance(versions, list) or len(versions) != 2
      or not all(map(_is_int, versions))
      or not isinstance(meta["env_failure"], (str, type(None)))
      or not isinstance(meta["info"], dict)):
    raise RecordError("malformed", f"metadata of the wrong types: {str(meta)[:200]}")
  routed = None
  if ROUTING in members:
    routed = _read_npy(members[ROUTING], ROUTING, "i", max_tokens, ndim=3,
                       max_itemsize=_ROUTING_ITEMSIZE, max_row=MAX_ROUTED_PER_TOKEN)
  return Trajectory(**arrays, prompt_id=meta["prompt_id"], policy_versions=tuple(versions),
                    env_failure=meta["env_failure"], info=meta["info"], routed_experts=routed)


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)
