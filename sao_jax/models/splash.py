"""The learner's attention through jax's Pallas splash attention kernel (TPU).

  choose(impl, block, device, mesh_shape, shapes) -> Choice(impl, why, blocks)
  learner_choice(model, mesh, rows, seq_len)      -> the Choice of the learner's forward
  traced_choice(impl, block, q, k)                -> the Choice for arrays being traced
  splash_attention(q, k, v, segment_ids_BxS, window, blocks) -> out_BxTxNxH
  splash_blocks(block, seq_len)                   -> the kernel's BlockSizes

`jax.experimental.pallas.ops.tpu.splash_attention` computes, per row and head,
softmax(q k^T + mask) v block by block with an online softmax (as
`attention.blocked_attention` does in pure JAX) and has its own `custom_vjp`
(a dq kernel and a dkv kernel, each recomputing the scores). Its mask is the
AND of a static mask over indices, from which it skips whole blocks (causal:
key index <= query index; with a sliding window W, also query index - key
index < W), and segment ids (query and key in the same segment). Here the
segment ids are `sao_jax.segments`' (0 on padding): query t reads key s iff
s <= t, seg[s] == seg[t] (and t - s < W), the `attention.CausalMask` relation
with two differences, both on tokens no loss reads:

- padding queries (id 0) read the padding keys before them (the kernel wants
  no empty row); their outputs are set to 0, as the blocked path gives;
- the window counts index distance where `CausalMask` counts positions within
  the segment: the same on every row whose segments have no padding inside
  them, which is every row the learner trains on (`data.pipeline.pack_rows`
  writes segments back to back, padding at the end).

Queries are scaled by H**-0.5 before the kernel (it applies no scale). Rows are
padded with id-0 tokens to a multiple of the block; GQA is the kernel's own
(query head n reads KV head n // (N / K)).

Which path runs: `model.attention_impl` "splash" or "auto", resolved by `choose`
at trace time from the devices traced for (a learner's mesh, or sao-plan's
compile-only TPU topology) and the per-device shapes, so that `sao-plan` and the
learner reach the same answer for the same mesh. "auto" takes the kernel on TPU
unless `splash_unsupported` names a reason, else the blocked path; "splash"
runs the kernel on TPU, in Pallas interpret mode on CPU (tests), and is an error
wherever `splash_unsupported` names a reason. On a mesh the kernel runs per
device under `shard_map`, rows over the batch axes, heads over `tensor`
(`sao_jax.sharding.rules`); a mesh axis that splits neither, or one that splits
the sequence, is a reason not to (the kernel sees whole sequences of its own
rows and heads).

Block sizes: `model.attention_block` positions per query and key block in the
forward and both backward kernels (the blocked path's knob), capped at the
padded sequence length; the kernel's lanes need a multiple of 128. The learner
and `sao-plan` get them from `splash_blocks`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from jax.sharding import PartitionSpec

from sao_jax.sharding.rules import logical_to_spec

LANES = 128  # the kernel's key blocks are whole vregs of 128 lanes
# The head widths libtpu is shown to compile the kernel for on v5e, v5p and v6e
# (tests/models/test_splash_tpu.py); others are not offered to it.
COMPILED_HEAD_DIMS = (64, 128, 256)
# The largest block offered to the kernel: at 2048, head_dim 128 in bfloat16, libtpu
# 0.0.42.1 runs out of v5e's scoped VMEM for the forward kernel; 1024 compiles
# (tests/models/test_splash_tpu.py).
MAX_BLOCK = 1024


class SplashShapes(NamedTuple):
  """One device's attention call: what the kernel's support depends on."""
  rows: int
  seq_len: int
  num_heads: int
  num_kv_heads: int
  head_dim: int


class Choice(NamedTuple):
  impl: str  # "splash" or "blocked"
  why: str
  blocks: kernel.BlockSizes | None = None  # the kernel's, when impl == "splash"

  def describe(self) -> str:
    if self.blocks is None:
      return f"{self.impl} ({self.why})"
    return f"{self.impl}, blocks of {self.blocks.block_q} ({self.why})"


def splash_blocks(block: int, seq_len: int) -> kernel.BlockSizes:
  """Blocks of min(`block`, seq_len rounded up to 128) positions for the forward, dq
  and dkv kernels (the row is padded to a multiple of it)."""
  size = min(block, -(-seq_len // LANES) * LANES)
  return kernel.BlockSizes(block_q=size, block_kv=size, block_kv_compute=size,
                           block_q_dkv=size, block_kv_dkv=size, block_kv_dkv_compute=size,
                           block_q_dq=size, block_kv_dq=size)


def _mesh_split(mesh_shape: dict[str, int], shapes: SplashShapes
                ) -> tuple[PartitionSpec, PartitionSpec, str | None]:
  """(spec of q [B, T, N, H], spec of k/v [B, S, K, H], why the kernel cannot run per
  device on this mesh or None)."""
  q_spec = logical_to_spec(("activation_batch", "activation_length", "activation_heads",
                            "head_dim"), (shapes.rows, shapes.seq_len, shapes.num_heads,
                                          shapes.head_dim), mesh_shape, strict=False)
  kv_spec = logical_to_spec(("activation_batch", "activation_length", "activation_kv_heads",
                             "head_dim"), (shapes.rows, shapes.seq_len, shapes.num_kv_heads,
                                           shapes.head_dim), mesh_shape, strict=False)
  if q_spec[1] is not None:
    return q_spec, kv_spec, f"mesh axis {q_spec[1]!r} splits the sequence; the kernel reads whole ones"
  if q_spec[2] != kv_spec[2]:
    return q_spec, kv_spec, (f"{shapes.num_kv_heads} KV heads do not split over mesh axis "
                             f"{q_spec[2]!r}, which splits the {shapes.num_heads} query heads")
  used = {a for entry in q_spec if entry is not None
          for a in (entry if isinstance(entry, tuple) else (entry,))}
  idle = [axis for axis, size in mesh_shape.items() if size > 1 and axis not in used]
  if idle:
    return q_spec, kv_spec, (f"mesh axes {idle} split neither the {shapes.rows} rows nor the "
                             f"{shapes.num_heads} heads (each device would redo another's rows)")
  return q_spec, kv_spec, None


def per_device(mesh_shape: dict[str, int], shapes: SplashShapes) -> SplashShapes:
  """`shapes` as one device of the mesh sees them."""
  q_spec, kv_spec, _ = _mesh_split(mesh_shape, shapes)
  count = lambda entry: math.prod(mesh_shape[a] for a in (
      () if entry is None else entry if isinstance(entry, tuple) else (entry,)))
  return shapes._replace(rows=shapes.rows // count(q_spec[0]),
                         num_heads=shapes.num_heads // count(q_spec[2]),
                         num_kv_heads=shapes.num_kv_heads // count(kv_spec[2]))


def splash_unsupported(block: int, mesh_shape: dict[str, int], shapes: SplashShapes) -> str | None:
  """Why the splash kernel cannot take this attention (global shapes on a mesh of
  `mesh_shape`, blocks of `block`), or None: the one list of refusals."""
  if block % LANES:
    return f"model.attention_block={block} is not a multiple of {LANES} (the kernel's lanes)"
  if block > MAX_BLOCK:
    return (f"model.attention_block={block} is over {MAX_BLOCK}: larger blocks run out of "
            "the kernel's VMEM on v5e")
  if shapes.head_dim not in COMPILED_HEAD_DIMS:
    return (f"head_dim={shapes.head_dim} is not one libtpu is shown to compile the kernel for "
            f"{COMPILED_HEAD_DIMS}")
  return _mesh_split(mesh_shape, shapes)[2]


def choose(impl: str, block: int, device, mesh_shape: dict[str, int],
           shapes: SplashShapes) -> Choice:
  """The path `impl` ("splash" or "auto") takes on `device`'s platform for `shapes`
  (global: all rows and heads) on a mesh of `mesh_shape` ({} without one)."""
  platform = device.platform
  if impl == "auto" and platform != "tpu":
    return Choice("blocked", f"model.attention_impl='auto' on {platform}: the splash kernel "
                  "is TPU-only")
  if impl == "splash" and platform not in ("tpu", "cpu"):
    raise ValueError(f"model.attention_impl='splash' is invalid on {platform}: the Pallas splash "
                     "kernel runs on TPU (and interpreted on CPU); set 'auto' or 'blocked'")
  reason = splash_unsupported(block, mesh_shape, shapes)
  if reason is None:
    mode = "" if platform == "tpu" else ", in Pallas interpret mode"
    return Choice("splash", f"model.attention_impl={impl!r} on {platform}{mode}",
                  splash_blocks(block, shapes.seq_len))
  if impl == "splash":
    raise ValueError(f"model.attention_impl='splash' is invalid here: the Pallas splash kernel "
                     f"does not take this attention ({reason}); set 'auto' or 'blocked'")
  return Choice("blocked", f"model.attention_impl='auto' on tpu, and the splash kernel does not "
                f"take this attention: {reason}")


def learner_choice(model, mesh: jax.sharding.Mesh, rows: int, seq_len: int) -> Choice | None:
  """The Choice of a full forward of `rows` x `seq_len` tokens on `mesh` for
  `model.attention_impl` (None: "dense" or "blocked", nothing to choose): what the
  learner logs and sao-plan prints, the same call `traced_choice` makes."""
  if model.attention_impl not in ("splash", "auto"):
    return None
  shapes = SplashShapes(rows, seq_len, model.num_attention_heads, model.num_key_value_heads,
                        model.head_dim)
  return choose(model.attention_impl, model.attention_block, mesh.devices.flat[0],
                dict(mesh.shape), shapes)


def _traced_device():
  """The device being traced for: the abstract mesh's, else the default device."""
  device = jax.sharding.get_abstract_mesh().abstract_device
  if device is None:
    default = jax.config.jax_default_device
    device = default if isinstance(default, jax.Device) else jax.devices(default)[0]
  return device


def traced_choice(impl: str, block: int, q_BxTxNxH: jax.Array, k_BxSxKxH: jax.Array) -> Choice:
  """`choose` for arrays traced on the abstract mesh (or the default device)."""
  b, t, n, h = q_BxTxNxH.shape
  mesh = jax.sharding.get_abstract_mesh()
  mesh_shape = {} if mesh.empty else dict(mesh.shape)
  return choose(impl, block, _traced_device(), mesh_shape,
                SplashShapes(b, t, n, k_BxSxKxH.shape[2], h))


def _local(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, seg_BxS, window, blocks, interpret):
  """The kernel on one device's rows and heads; T a multiple of the block."""
  b, t, n, h = q_BxTxNxH.shape
  causal = (masks.CausalMask((t, t)) if window is None
            else masks.LocalMask((t, t), (window - 1, 0), 0))
  splash = kernel.make_splash_mha(masks.MultiHeadMask([causal] * n), block_sizes=blocks,
                                  head_shards=1, q_seq_shards=1, interpret=interpret)
  q_BxNxTxH = jnp.swapaxes(q_BxTxNxH * jnp.asarray(h ** -0.5, q_BxTxNxH.dtype), 1, 2)
  k_BxKxSxH, v_BxKxSxH = (jnp.swapaxes(x.astype(q_BxTxNxH.dtype), 1, 2)
                          for x in (k_BxSxKxH, v_BxSxKxH))
  segments = kernel.SegmentIds(q=seg_BxS, kv=seg_BxS)
  out_BxNxTxH = jax.vmap(splash)(q_BxNxTxH, k_BxKxSxH, v_BxKxSxH, segments)
  return jnp.where((seg_BxS != 0)[:, :, None, None], jnp.swapaxes(out_BxNxTxH, 1, 2), 0)


def splash_attention(q_BxTxNxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array,
                     segment_ids_BxS: jax.Array, window: int | None,
                     blocks: kernel.BlockSizes) -> jax.Array:
  """Causal attention within segments (and a sliding window) through the kernel
  (module docstring); T == S, any T. On the abstract mesh being traced, per device
  under shard_map (the specs of `_mesh_split`, which `choose` has accepted)."""
  b, t, n, h = q_BxTxNxH.shape
  if k_BxSxKxH.shape[1] != t:
    raise ValueError(f"splash_attention: key length {k_BxSxKxH.shape[1]} != query length {t}; "
                     "the causal mask needs a sequence attending to itself")
  size = blocks.block_q
  pad = -(-t // size) * size - t
  seg_BxS = jnp.pad(segment_ids_BxS.astype(jnp.int32), ((0, 0), (0, pad)))
  q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
             for x in (q_BxTxNxH, k_BxSxKxH, v_BxSxKxH))
  interpret = _traced_device().platform != "tpu"
  local = lambda q, k, v, seg: _local(q, k, v, seg, window, blocks, interpret)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    shapes = SplashShapes(b, t + pad, n, k.shape[2], h)
    q_spec, kv_spec, _ = _mesh_split(dict(mesh.shape), shapes)
    # check_vma off as for the paged kernel: every mesh axis splits rows or heads here
    # (`_mesh_split` refuses a mesh where one does not), so no input is replicated.
    local = jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec,
                                                      PartitionSpec(q_spec[0], None)),
                          out_specs=q_spec, check_vma=False)
  return local(q, k, v, seg_BxS)[:, :t]
