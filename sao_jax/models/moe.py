"""Dropless top-k expert computation for Qwen3-MoE, on one device or expert-parallel.

Given tokens x_n, their k chosen experts e_{n,j} and routing weights w_{n,j},

    y_n = sum_j w_{n,j} * down_e(silu(x_n gate_e) * (x_n up_e)),   e = e_{n,j}.

Both paths sort the (token, expert) pairs by expert and run the three matmuls as
`jax.lax.ragged_dot`, so the work is proportional to k, not to the number of
experts, and no token is ever dropped (no capacity factor).

`expert_ffn` computes this for whatever tokens and experts it is given.
`expert_parallel_ffn` runs it under `jax.shard_map` when a mesh is active. Left
to the SPMD partitioner, the global argsort of all pairs cannot be split, so the
routed activations of every device's tokens land on every device (about 70 GB
per [pairs, hidden] array for Qwen3-30B-A3B with 32K-token rows on 64 chips).
Under shard_map each device instead:

  1. all-gathers the tokens (and their routing) of its `expert`-axis group, since
     its experts may be chosen by any of them;
  2. receives its experts' weights whole along the hidden dimension (the
     partitioner all-gathers the fsdp shards at use, like any FSDP weight);
  3. sorts only the gathered pairs that chose one of *its* experts to the front,
     and runs the ragged matmuls on them (pairs for other experts fall past the
     last group and are masked out);
  4. sums the partial outputs: over the axes that shard the MLP width (tensor,
     Megatron style) and, with a reduce-scatter, over the expert group, which
     hands every device back the outputs for exactly its own tokens.

The all-gather + reduce-scatter pair moves the same bytes as the all-to-all
dispatch/combine of capacity-based expert parallelism, without a capacity: the
price of dropless routing is a pair buffer sized for the worst case, every pair
of the group choosing this device's experts (group size x tokens x k rows).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from sao_jax.sharding.rules import logical_to_spec


def expert_index_dtype(num_experts: int) -> np.dtype:
  """The dtype of recorded expert indices (`routed_experts`): int8 for at most 127
  experts, int16 above (-1 marks "not recorded", so the range must hold it)."""
  if num_experts > np.iinfo(np.int16).max:
    raise ValueError(f"model.num_experts={num_experts}: recorded expert indices are int16, "
                     f"so at most {np.iinfo(np.int16).max} experts per layer")
  return np.dtype(np.int8 if num_experts <= np.iinfo(np.int8).max else np.int16)


def route(logits_BxTxE: jax.Array, k: int, norm_topk_prob: bool,
          replay_BxTxK: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(weight_BxTxK, expert_BxTxK): the top-k experts of p = softmax(logits) and their
  gates p_e, renormalised to sum to one with `norm_topk_prob`.

  Router replay (R3): where a token's `replay_BxTxK` row holds k recorded experts
  (every entry in [0, E)) those experts are used instead of the top k, with gates
  p_e of *these* logits at the recorded experts (renormalised the same way), so the
  router keeps its gradient; any other row (-1: not recorded) routes freely.
  """
  probs_BxTxE = jax.nn.softmax(logits_BxTxE.astype(jnp.float32), axis=-1)
  weight_BxTxK, expert_BxTxK = jax.lax.top_k(probs_BxTxE, k)
  if replay_BxTxK is not None:
    replay_BxTxK = replay_BxTxK.astype(jnp.int32)
    forced_BxTx1 = jnp.all((replay_BxTxK >= 0) & (replay_BxTxK < logits_BxTxE.shape[-1]),
                           axis=-1, keepdims=True)
    expert_BxTxK = jnp.where(forced_BxTx1, replay_BxTxK, expert_BxTxK)
    weight_BxTxK = jnp.take_along_axis(probs_BxTxE, expert_BxTxK, axis=-1)
  if norm_topk_prob:
    weight_BxTxK = weight_BxTxK / jnp.sum(weight_BxTxK, axis=-1, keepdims=True)
  return weight_BxTxK, expert_BxTxK


def routed_experts(router_logits: tuple[jax.Array, ...], k: int,
                   num_experts: int) -> jax.Array | None:
  """[B, T, L, k]: the top-k experts `route` picks in each of the L MoE layers (L =
  len(router_logits)), in `expert_index_dtype`; None for a dense model (no router)."""
  if not router_logits:
    return None
  return jnp.stack([route(logits, k, False)[1] for logits in router_logits],
                   axis=2).astype(expert_index_dtype(num_experts))


def routing_changes(router_logits: tuple[jax.Array, ...], recorded_BxTxLxK: jax.Array,
                    k: int) -> tuple[jax.Array, jax.Array]:
  """(changed_BxTxL, recorded_BxT): whether MoE layer l's top-k expert *set* under
  `router_logits` (`route`'s choice) differs from the recorded one, and whether token
  t has a record (every entry >= 0 in every layer). Order within the k does not count."""
  recorded_BxTxLxK = recorded_BxTxLxK.astype(jnp.int32)
  current_BxTxLxK = jnp.stack([route(logits, k, False)[1] for logits in router_logits], axis=2)
  changed_BxTxL = jnp.any(jnp.sort(current_BxTxLxK, axis=-1)
                          != jnp.sort(recorded_BxTxLxK, axis=-1), axis=-1)
  return changed_BxTxL, jnp.all(recorded_BxTxLxK >= 0, axis=(2, 3))


def expert_ffn(x_NxD: jax.Array, expert_NxK: jax.Array, weight_NxK: jax.Array,
               gate_ExDxF: jax.Array, up_ExDxF: jax.Array, down_ExFxD: jax.Array,
               first_expert: jax.Array | int = 0) -> jax.Array:
  """y_NxD for the pairs routed to experts [first_expert, first_expert + E).

  Pairs that chose another expert contribute nothing, so summing the outputs of
  disjoint expert ranges gives the full MoE output. Compute dtype is x's.
  """
  k = expert_NxK.shape[1]
  num_local = gate_ExDxF.shape[0]
  local_M = expert_NxK.reshape(-1) - first_expert
  is_local_M = (local_M >= 0) & (local_M < num_local)
  # Pairs for other experts get key num_local: sorted last, past every group, so
  # ragged_dot leaves their rows out of all groups.
  key_M = jnp.where(is_local_M, local_M, num_local)
  order_M = jnp.argsort(key_M, stable=True)
  token_M = order_M // k
  group_sizes_E = jnp.bincount(key_M, length=num_local + 1)[:num_local].astype(jnp.int32)
  dt = x_NxD.dtype
  xs_MxD = x_NxD[token_M]
  gate_MxF = jax.lax.ragged_dot(xs_MxD, gate_ExDxF.astype(dt), group_sizes_E)
  up_MxF = jax.lax.ragged_dot(xs_MxD, up_ExDxF.astype(dt), group_sizes_E)
  out_MxD = jax.lax.ragged_dot(jax.nn.silu(gate_MxF) * up_MxF, down_ExFxD.astype(dt), group_sizes_E)
  weight_Mx1 = weight_NxK.reshape(-1)[order_M][:, None].astype(dt)
  # `where`, not a product with a 0/1 mask: rows outside every group are not
  # guaranteed to be finite on every backend.
  contribution_MxD = jnp.where(is_local_M[order_M][:, None], out_MxD * weight_Mx1, 0)
  return jnp.zeros_like(x_NxD).at[token_M].add(contribution_MxD)


def _axes(entry) -> tuple[str, ...]:
  """Mesh axes of one PartitionSpec entry (None, a name, or a tuple of names)."""
  if entry is None:
    return ()
  return entry if isinstance(entry, tuple) else (entry,)


def expert_parallel_ffn(x_BxTxD: jax.Array, expert_BxTxK: jax.Array, weight_BxTxK: jax.Array,
                        gate_ExDxF: jax.Array, up_ExDxF: jax.Array, down_ExFxD: jax.Array
                        ) -> jax.Array:
  """`expert_ffn` with tokens and experts split over the active mesh (see module doc).

  Without an active mesh this is `expert_ffn` on the whole batch. The shardings
  come from the same logical rules as everywhere else: tokens as
  ("activation_batch", "activation_length", "activation_embed"), expert weights
  as their params ("expert", "embed", "mlp") and ("expert", "mlp", "embed").
  """
  mesh = jax.sharding.get_abstract_mesh()
  b, t, d = x_BxTxD.shape
  if mesh.empty:
    y_NxD = expert_ffn(x_BxTxD.reshape(b * t, d), expert_BxTxK.reshape(b * t, -1),
                       weight_BxTxK.reshape(b * t, -1), gate_ExDxF, up_ExDxF, down_ExFxD)
    return y_NxD.reshape(b, t, d)
  mesh_shape = dict(mesh.shape)
  # Tokens: batch and length split as the activation rules allow (non-dividing axes
  # left out, so those devices hold the same tokens; length splits only over the
  # sequence axis, whose devices share the experts); hidden whole.
  batch, length = logical_to_spec(("activation_batch", "activation_length"), (b, t), mesh_shape,
                                  strict=False)
  token_spec = PartitionSpec(batch, length, None)
  gate_spec = logical_to_spec(("expert", "embed", "mlp"), gate_ExDxF.shape, mesh_shape,
                              strict=True, what="MoE gate_proj")
  expert_axes, _, mlp_axes = (_axes(entry) for entry in gate_spec)
  # Weights enter whole along the hidden dimension: the partitioner all-gathers
  # their fsdp shards at the boundary (and reduce-scatters their gradients), as
  # for any FSDP weight at use. Experts and MLP width stay split.
  expert_spec, mlp_spec = gate_spec[0], gate_spec[2]
  in_up_spec = PartitionSpec(expert_spec, None, mlp_spec)
  down_spec = PartitionSpec(expert_spec, mlp_spec, None)
  # Tokens are gathered over the expert axes that also split them; over expert
  # axes that do not, every device already holds the whole group's tokens.
  gathered_axes = tuple(axis for axis in expert_axes if axis in _axes(batch))
  reduced_axes = tuple(axis for axis in expert_axes if axis not in gathered_axes) + mlp_axes
  num_local = gate_ExDxF.shape[0] // math.prod(mesh_shape[axis] for axis in expert_axes)

  def local(x, expert, weight, gate, up, down):
    if gathered_axes:
      x, expert, weight = (jax.lax.all_gather(a, gathered_axes, axis=0, tiled=True)
                           for a in (x, expert, weight))
    # Replicated tokens meet device-specific experts: mark them device-varying
    # explicitly, so their cotangents are summed over those axes. Without this
    # cast (check_vma inferring it), the token gradient came out wrong when
    # tokens were replicated over the expert axis (tests/models/test_moe.py).
    x, expert, weight = jax.lax.pcast((x, expert, weight), reduced_axes, to="varying")
    first = jax.lax.axis_index(expert_axes) * num_local if expert_axes else 0
    gb, gt = x.shape[:2]
    y = expert_ffn(x.reshape(gb * gt, d), expert.reshape(gb * gt, -1),
                   weight.reshape(gb * gt, -1), gate, up, down, first).reshape(gb, gt, d)
    if reduced_axes:
      y = jax.lax.psum(y, reduced_axes)
    if gathered_axes:
      y = jax.lax.psum_scatter(y, gathered_axes, scatter_dimension=0, tiled=True)
    return y

  return jax.shard_map(
      local, mesh=mesh,
      in_specs=(token_spec, token_spec, token_spec, in_up_spec, in_up_spec, down_spec),
      out_specs=token_spec,
  )(x_BxTxD, expert_BxTxK, weight_BxTxK, gate_ExDxF, up_ExDxF, down_ExFxD)


def load_balancing_loss(router_logits: tuple[jax.Array, ...], seg_BxT: jax.Array,
                        top_k: int) -> jax.Array:
  """The router's auxiliary load-balancing loss, Qwen3-MoE's formulation
  (`transformers`' `load_balancing_loss_func` with an attention mask):

      loss = E * sum_e f_e * P_e

  pooled over every MoE layer's real tokens (`seg_BxT != 0`): f_e = top-k
  assignments to expert e per token-row, P_e = mean router probability of e.
  Perfect balance gives k; gradients flow through P only (top-k is discrete).
  0.0 for a dense model (no router logits).
  """
  if not router_logits:
    return jnp.zeros((), jnp.float32)
  w_BxT = (seg_BxT != 0).astype(jnp.float32)
  num_experts = router_logits[0].shape[-1]
  counts_E = jnp.zeros((num_experts,), jnp.float32)
  probs_E = jnp.zeros((num_experts,), jnp.float32)
  for logits_BxTxE in router_logits:
    p_BxTxE = jax.nn.softmax(logits_BxTxE.astype(jnp.float32), axis=-1)
    _, expert_BxTxK = jax.lax.top_k(p_BxTxE, top_k)
    counts_E += jnp.einsum("btke,bt->e", jax.nn.one_hot(expert_BxTxK, num_experts), w_BxT)
    probs_E += jnp.einsum("bte,bt->e", p_BxTxE, w_BxT)
  rows = jnp.maximum(len(router_logits) * jnp.sum(w_BxT), 1.0)
  return num_experts * jnp.sum((counts_E / rows) * (probs_E / rows))
