"""The paged engine's two device programs, pure and jitted once in `compile_steps`.

  prefill(params, cache, pages_NxM, rows_B, tokens_BxC, mask_BxC, start_B, seed_B)
      -> (cache, token_B, behavior_logp_B)
  decode(params, cache, pages_NxM, token_N, active_N, budget_N, seed_N)
      -> (cache, tokens_KxN, behavior_logp_KxN, emitted_KxN, experts_KxNxLxk)

Like `sao_jax.sampler.steps`, over a `paged.PagedKVCache` and the host's page
tables (`sao_jax.sampler.pages`). `prefill` runs B rows at once (batched
prefill): row b sets slot rows_B[b] to hold start_B[b] tokens, appends its real
chunk tokens and samples the token that follows (rows_B[b] >= N: a padding row,
no effect). Each row reads only its own slot's pages, so its result does not
depend on the other rows. `decode` is `steps.decode` with attention over the
pages listed in pages_NxM (the host lists only active slots' pages), at most
`entries` of them per page shard (static: the shard's pages, or twice that while
pages are shared; `sao_jax.sampler.pages`). On a mesh whose batch axes split the
pool into D shards (`sao_jax.models.paged_mesh`), page ids are local to the
slot's shard and prefill's B rows are D blocks, block d for shard d's slots. Sampling keys and
`behavior_logp` are exactly the dense engine's. The cache argument is donated.
Both attend through jax's Pallas TPU kernel or the pure-JAX reference as
`attention_path` decides.

Module interface, shared with `sao_jax.sampler.steps` (the dense layout) so that
`sao_jax.sampler.kv_layout` can treat both alike: `compile_steps`, `init_cache`,
`new_cache`, `cache_shardings`, `abstract_decode_args`, `cache_rows`.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from sao_jax.config import ModelConfig
from sao_jax.config.sampler import SamplerConfig
from sao_jax.models import paged
from sao_jax.models.paged_kernel import kernel_unsupported
from sao_jax.models.paged_mesh import (check_split, page_entry, page_shards, pool_head_axis,
                                       pool_spec)
from sao_jax.models.transformer import Params
from sao_jax.sampler.sampling import sample, token_keys
from sao_jax.sampler.steps import Sampling, decode_loop
from sao_jax.sharding.mesh import host_outputs, traced_on


class PagedSteps(NamedTuple):
  prefill: Callable
  decode: Callable


def prefill(params: Params, cache: paged.PagedKVCache, pages_NxM: jax.Array, rows_B: jax.Array,
            tokens_BxC: jax.Array, mask_BxC: jax.Array, start_B: jax.Array, seed_B: jax.Array, *,
            cfg: ModelConfig, sampling: Sampling, kernel: bool = False
            ) -> tuple[paged.PagedKVCache, jax.Array, jax.Array]:
  """Batched chunked prefill of B slots, then one sampled token per row (module docstring;
  with `kernel` attention is the Pallas TPU kernel's)."""
  cache = paged.set_lengths(cache, rows_B, start_B)
  logits_BxV, cache = paged.extend_paged(params, cfg, cache, pages_NxM, rows_B, tokens_BxC,
                                         mask_BxC, kernel=kernel)
  length_B = cache.length_N.at[rows_B].get(mode="fill", fill_value=0)
  token_B, logp_B = sample(logits_BxV, token_keys(seed_B, length_B), sampling.temperature,
                           sampling.top_k, sampling.top_p)
  return cache, token_B, logp_B


def decode(params: Params, cache: paged.PagedKVCache, pages_NxM: jax.Array, token_N: jax.Array,
           active_N: jax.Array, budget_N: jax.Array, seed_N: jax.Array, *, entries: int,
           cfg: ModelConfig, sampling: Sampling, kernel: bool = False
           ) -> tuple[paged.PagedKVCache, jax.Array, jax.Array, jax.Array, jax.Array | None]:
  """steps_per_call decode steps over every slot (`steps.decode_loop`, paged attention;
  with `kernel` the Pallas TPU kernel's)."""
  rows_N = jnp.arange(token_N.shape[0], dtype=jnp.int32)

  def extend(c, t_N, a_N):
    logits_NxV, c, experts_Nx1xLxk = paged.extend_paged_routed(
        params, cfg, c, pages_NxM, rows_N, t_N[:, None], a_N[:, None], entries=entries,
        kernel=kernel)
    return logits_NxV, c, None if experts_Nx1xLxk is None else experts_Nx1xLxk[:, 0]

  return decode_loop(extend, lambda c: c.length_N, cache, token_N, active_N, budget_N, seed_N,
                     sampling)


def attention_path(sampler: SamplerConfig, cfg: ModelConfig,
                   mesh: jax.sharding.Mesh | None = None) -> str:
  """"pallas" or "reference": the path of `attention_choice`."""
  return attention_choice(sampler, cfg, mesh)[0]


def attention_choice(sampler: SamplerConfig, cfg: ModelConfig,
                     mesh: jax.sharding.Mesh | None = None) -> tuple[str, str]:
  """("pallas" or "reference", why): the prefill and decode attention
  `sampler.paged_attention` selects for this model on `mesh`'s devices (None: the
  default backend's), and a sentence saying why (what the sampler logs and sao-plan
  prints).

  "auto" is the Pallas TPU kernel on TPU and the reference elsewhere, and the
  reference on TPU too for a model whose per-device attention shapes libtpu cannot
  compile the kernel for (`paged_kernel.kernel_unsupported`: head_dim not a multiple
  of 128, KV heads that do not tile, head_dim 256 with more than one KV head per
  device); "pallas" for such a model is an error.
  """
  choice = sampler.paged_attention
  platform = jax.default_backend() if mesh is None else mesh.devices.flat[0].platform
  if choice == "reference":
    return "reference", "sampler.paged_attention='reference'"
  if choice == "auto" and platform != "tpu":
    return "reference", f"sampler.paged_attention='auto' on {platform}: the kernel is TPU-only"
  kv = cfg.num_key_value_heads
  axis = None if mesh is None else pool_head_axis(dict(mesh.shape), kv)
  shards = 1 if axis is None else mesh.shape[axis]
  reason = kernel_unsupported(cfg.num_attention_heads // shards, kv // shards, cfg.head_dim,
                              cfg.compute_dtype)
  if reason is None:
    return "pallas", f"sampler.paged_attention={choice!r} on {platform}"
  if choice == "pallas":
    raise ValueError(f"sampler.paged_attention='pallas' is invalid for this model: the Pallas "
                     f"ragged paged attention kernel does not take its attention ({reason}); "
                     f"set sampler.paged_attention='auto' or 'reference'")
  return "reference", (f"sampler.paged_attention='auto' on tpu, and the Pallas kernel does not "
                       f"take this model's attention on {shards} KV-head shard(s): {reason}")


def compile_steps(cfg: ModelConfig, sampler: SamplerConfig, stop_token_ids: tuple[int, ...],
                        mesh: jax.sharding.Mesh | None = None) -> PagedSteps:
  """`prefill` and `decode` jitted with the configs bound and the cache donated."""
  return _compiled(cfg, Sampling(float(sampler.temperature), sampler.top_k, float(sampler.top_p),
                                 sampler.steps_per_call, tuple(sorted(stop_token_ids))), mesh,
                   attention_path(sampler, cfg, mesh) == "pallas")


@functools.lru_cache(maxsize=None)
def _compiled(cfg: ModelConfig, sampling: Sampling, mesh: jax.sharding.Mesh | None,
              kernel: bool) -> PagedSteps:
  def jitted(program, **static):
    return jax.jit(program if mesh is None else traced_on(mesh, host_outputs(mesh, program)), donate_argnums=1,
                   **static)

  bind = functools.partial
  return PagedSteps(prefill=jitted(bind(prefill, cfg=cfg, sampling=sampling, kernel=kernel)),
                    decode=jitted(bind(decode, cfg=cfg, sampling=sampling, kernel=kernel),
                                  static_argnames="entries"))


def cache_shardings(cache, mesh: jax.sharding.Mesh):
  """Pools [P, page, 2K, H] split as `paged_mesh.pool_spec` splits them: pages over the
  batch axes (D shards), the combined-head axis over tensor where tensor divides K;
  lengths [N] over the batch axes too, each shard's slots with their pages."""
  mesh_shape = dict(mesh.shape)
  leaves = jax.tree.leaves(cache)
  check_split(next(l.shape[0] for l in leaves if l.ndim == 1),
              next(l.shape[0] for l in leaves if l.ndim > 1), mesh_shape)

  def one(leaf):
    if leaf.ndim == 1:
      spec = PartitionSpec(page_entry(mesh_shape))
    else:
      spec = pool_spec(mesh_shape, leaf.shape[2] // 2)
    return jax.sharding.NamedSharding(mesh, spec)

  return jax.tree.map(one, cache)


def init_cache(cfg: ModelConfig, sampler: SamplerConfig) -> paged.PagedKVCache:
  """An empty pool of `sampler.num_kv_pages()` pages, lengths for `sampler.slots` slots."""
  return paged.init_paged_cache(cfg, sampler.num_kv_pages(), sampler.kv_page_size, sampler.slots)


def new_cache(cfg: ModelConfig, sampler: SamplerConfig,
              mesh: jax.sharding.Mesh | None = None) -> paged.PagedKVCache:
  """`init_cache`, created sharded on `mesh` (`cache_shardings`)."""
  init = functools.partial(init_cache, cfg, sampler)
  if mesh is None:
    return init()
  return jax.jit(init, out_shardings=cache_shardings(jax.eval_shape(init), mesh))()


def abstract_decode_args(sampler: SamplerConfig, mesh: jax.sharding.Mesh):
  """The host arguments of `decode` after (params, cache), as the engine passes them
  (numpy: replicated), and its static keywords, every page of each shard listed: for
  lowering."""
  host = jax.sharding.NamedSharding(mesh, PartitionSpec())
  arg = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=host)
  n = sampler.slots
  columns = -(-sampler.max_seq_len // sampler.kv_page_size)
  return ((arg((n, columns), jnp.int32), arg((n,), jnp.int32), arg((n,), jnp.bool_),
           arg((n,), jnp.int32), arg((n,), jnp.uint32)),
          {"entries": sampler.num_kv_pages() // page_shards(dict(mesh.shape))})


def cache_rows(sampler: SamplerConfig, seq_len: int) -> int:
  """Rows of `seq_len` tokens the cache's memory holds: `slots`, or for a pool sized on
  its own (`kv_pages`) the rows of its pages."""
  if not sampler.kv_pages:
    return sampler.slots
  return max(sampler.kv_pages * sampler.kv_page_size // seq_len, 1)
