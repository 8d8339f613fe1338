"""The one table mapping logical axis names to mesh axes, and helpers applying it.

Layers name every parameter and key activation dimension with a logical axis
("embed", "heads", "activation_batch", ...). `RULES` maps each name to a tuple of
mesh axes (or `()` for replicated). A dimension is split over the product of
its mesh axes, skipping axes of size 1 and axes already used by an earlier
dimension of the same array (a mesh axis can shard only one dimension).

Parameters and jit inputs use `strict=True`: a dimension that the mesh axes do
not divide is a configuration error, reported with the array, the dimension and
the fix. Activation constraints inside the model use `strict=False` and simply
leave a non-dividing mesh axis out (shapes such as a decode batch of 1 vary at
run time, and a constraint is only a hint to the compiler).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

# Logical axis -> mesh axes. fsdp shards the model dimension of every weight
# (ZeRO-3 style: the compiler all-gathers a weight where it is used), and so does
# sequence, whose devices would otherwise each hold a whole replica; sequence
# also splits every sequence's positions (`sao_jax.sharding.sequence`); tensor
# shards heads, MLP width and vocabulary (Megatron style); expert shards the
# expert stack of MoE layers; batch-like activations split over data, fsdp and
# expert so every device works on its own tokens.
RULES: dict[str, tuple[str, ...]] = {
    # Parameters.
    "vocab": ("tensor",),
    "embed": ("fsdp", "sequence"),
    "mlp": ("tensor",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": (),
    "norm": (),
    "expert": ("expert",),
    # Activations.
    "activation_batch": ("data", "fsdp", "expert"),
    "activation_length": ("sequence",),
    "activation_embed": (),
    "activation_heads": ("tensor",),
    "activation_kv_heads": ("tensor",),
    "activation_mlp": ("tensor",),
    "activation_vocab": ("tensor",),
    "activation_expert": ("expert",),
    "cache_length": (),
    # The paged KV pool's page axis and the slots whose pages it holds
    # (sao_jax.models.paged_mesh): split over the batch axes but not `expert`.
    "kv_pages": ("data", "fsdp"),
}


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh_shape: dict[str, int],
                    *, strict: bool, what: str = "array") -> PartitionSpec:
  """PartitionSpec for an array of `shape` whose dimensions are named `axes`.

  `mesh_shape` maps mesh axis name -> size. With `strict`, a dimension that is not
  divisible by its mesh axes raises ValueError naming `what`.
  """
  if len(axes) != len(shape):
    raise ValueError(f"{what}: {len(axes)} logical axes {tuple(axes)} for shape {tuple(shape)}")
  used: set[str] = set()
  spec = []
  for dim, (name, size) in enumerate(zip(axes, shape)):
    if name is not None and name not in RULES:
      raise ValueError(f"{what}: logical axis {name!r} has no entry in sao_jax.sharding.rules.RULES; "
                       f"known names are {', '.join(sorted(RULES))}")
    chosen = []
    for mesh_axis in RULES.get(name, ()) if name is not None else ():
      mesh_size = mesh_shape.get(mesh_axis, 1)
      if mesh_size == 1 or mesh_axis in used:
        continue
      total = mesh_size
      for other in chosen:
        total *= mesh_shape[other]
      if size % total:
        if strict:
          raise ValueError(
              f"{what}: dimension {dim} ({name}={size}) is not divisible by mesh axes "
              f"{tuple(chosen) + (mesh_axis,)} of total size {total}; choose a mesh whose "
              f"{mesh_axis!r} size divides {size}, or change the model size")
        continue
      chosen.append(mesh_axis)
    used.update(chosen)
    spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
  return PartitionSpec(*spec)


def logical_sharding(mesh: jax.sharding.Mesh, axes: Sequence[str | None], shape: Sequence[int],
                     what: str = "array") -> NamedSharding:
  """NamedSharding of a jit input/output (strict divisibility), e.g. a token batch."""
  return NamedSharding(mesh, logical_to_spec(axes, shape, dict(mesh.shape), strict=True, what=what))


_HINTS = contextvars.ContextVar("sao_jax_activation_hints", default=True)


@contextlib.contextmanager
def activation_hints(enabled: bool) -> Iterator[None]:
  """Turns `constrain` on or off while tracing inside this context.

  A program traced on a mesh (for the expert-parallel MoE's shard_map) can still
  leave activation shardings to the compiler's propagation; see
  `sao_jax.learner.compile.compile_train_step` for when that is better.
  """
  token = _HINTS.set(enabled)
  try:
    yield
  finally:
    _HINTS.reset(token)


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """Hints the sharding of activation `x` from logical `axes`; no-op without a mesh
  or inside `activation_hints(False)`.

  The mesh comes from the caller's `jax.set_mesh(mesh)` context, so model code
  stays mesh-agnostic and runs unchanged on one device.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not _HINTS.get():
    return x
  spec = logical_to_spec(axes, x.shape, dict(mesh.shape), strict=False)
  return jax.lax.with_sharding_constraint(x, spec)
