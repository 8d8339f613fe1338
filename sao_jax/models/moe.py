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
from jax.sharding import PartitionSpec

from sao_jax.sharding.rules import logical_to_spec


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
