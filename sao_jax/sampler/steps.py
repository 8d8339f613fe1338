"""The engine's two device programs, pure and jitted once in `compile_steps`.

  prefill(params, cache, slot, tokens_1xC, mask_1xC, start, seed)
      -> (cache, token, behavior_logp)
  decode(params, cache, token_N, active_N, budget_N, seed_N)
      -> (cache, tokens_KxN, behavior_logp_KxN, emitted_KxN, experts_KxNxLxk)

`prefill` cuts cache row `slot` back to `start` tokens, appends the chunk's real
tokens (chunked prefill: a prompt, or an observation after the previous turn's
last sampled token) and samples the token that follows. Only that row is read
and written: the row is sliced out, extended as a batch of one and put back,
so the cost is that of C tokens, whatever the number of slots, and the result
does not depend on the other slots.

`decode` runs K = steps_per_call decode steps over all N slots in one
`lax.scan`. Slot n holds token_N[n], sampled but not yet in its cache; while
active_N[n], each step appends it, samples the next token and spends one unit
of budget_N[n]. A slot goes inactive after sampling a stop token or spending
its budget; inactive slots write nothing and emit nothing. emitted_KxN[k, n]
marks the steps in which slot n sampled a token. For an MoE model
experts_KxNxLxk[k, n] are the experts each of the L MoE layers routed the token
that step k appended to slot n (`moe.routed_experts`): the sampler's record for
router replay and the routing-mismatch metrics; None for a dense model.

The token at trajectory position t (the number of tokens before it, which is
the cache length of its row when it is sampled) is drawn with key
fold_in(key(seed), t) (`sampling.token_keys`). The cache argument is donated.

On a mesh (`sampler.sharded`), params are laid out by the sharding rules and
the cache by `cache_shardings` (slots over the batch axes, KV heads over
tensor); both programs are traced on the mesh, so MoE layers run expert
parallel, and their results equal the single-device programs'.

Module interface, shared with `sao_jax.sampler.paged_steps` (`sao_jax.sampler.
kv_layout`): `compile_steps`, `init_cache`, `new_cache`, `cache_shardings`,
`abstract_decode_args`, `cache_rows`.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from sao_jax.config import ModelConfig
from sao_jax.config.sampler import SamplerConfig
from sao_jax.models import decode as kv
from sao_jax.models.transformer import Params
from sao_jax.sampler.sampling import sample, token_keys
from sao_jax.sharding.mesh import host_outputs, traced_on
from sao_jax.sharding.rules import logical_to_spec


class Sampling(NamedTuple):
  """The static sampling knobs of the device programs (`SamplerConfig` fields)."""
  temperature: float
  top_k: int
  top_p: float
  steps_per_call: int
  stop_token_ids: tuple[int, ...]


class Steps(NamedTuple):
  prefill: Callable
  decode: Callable


def _row(cache: kv.KVCache, slot: jax.Array) -> kv.KVCache:
  return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, slot, 1, 0), cache)


def _put_row(cache: kv.KVCache, slot: jax.Array, row: kv.KVCache) -> kv.KVCache:
  return jax.tree.map(lambda x, r: jax.lax.dynamic_update_slice_in_dim(x, r, slot, 0), cache, row)


def prefill(params: Params, cache: kv.KVCache, slot: jax.Array, tokens_1xC: jax.Array,
            mask_1xC: jax.Array, start: jax.Array, seed: jax.Array, *, cfg: ModelConfig,
            sampling: Sampling) -> tuple[kv.KVCache, jax.Array, jax.Array]:
  """Chunked prefill of one slot, then one sampled token (module docstring)."""
  row = kv.truncate(_row(cache, slot), start[None])
  logits_1xV, row = kv.extend(params, cfg, row, tokens_1xC, mask_1xC)
  keys = token_keys(seed[None], row.length_B)
  token_1, logp_1 = sample(logits_1xV, keys, sampling.temperature, sampling.top_k, sampling.top_p)
  return _put_row(cache, slot, row), token_1[0], logp_1[0]


def decode_loop(extend: Callable, positions: Callable, cache, token_N: jax.Array,
                active_N: jax.Array, budget_N: jax.Array, seed_N: jax.Array,
                sampling: Sampling):
  """steps_per_call decode steps over every slot, for any cache layout (module
  docstring): `extend(cache, token_N, active_N) -> (logits_NxV, cache, experts_NxLxk)`
  appends one token per active row (experts None for a dense model), `positions(cache)
  -> [N]` is each row's length (the token index its sampling key folds in). Returns
  (cache, tokens_KxN, logp_KxN, emitted_KxN, experts_KxNxLxk)."""
  # An empty stop set still needs a [M] array; -1 matches no token.
  stop_M = jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32)

  def one_step(carry, _):
    cache, token_N, active_N, budget_N = carry
    logits_NxV, cache, experts_NxLxk = extend(cache, token_N, active_N)
    new_N, logp_N = sample(logits_NxV, token_keys(seed_N, positions(cache)),
                           sampling.temperature, sampling.top_k, sampling.top_p)
    emitted_N = active_N
    budget_N = budget_N - emitted_N.astype(jnp.int32)
    stopped_N = jnp.any(new_N[:, None] == stop_M[None, :], axis=1) | (budget_N <= 0)
    carry = (cache, jnp.where(emitted_N, new_N, token_N), active_N & ~stopped_N, budget_N)
    return carry, (new_N, logp_N, emitted_N, experts_NxLxk)

  (cache, _, _, _), (tokens_KxN, logp_KxN, emitted_KxN, experts_KxNxLxk) = jax.lax.scan(
      one_step, (cache, token_N, active_N.astype(bool), budget_N), length=sampling.steps_per_call)
  return cache, tokens_KxN, logp_KxN, emitted_KxN, experts_KxNxLxk


def decode(params: Params, cache: kv.KVCache, token_N: jax.Array, active_N: jax.Array,
           budget_N: jax.Array, seed_N: jax.Array, *, cfg: ModelConfig, sampling: Sampling
           ) -> tuple[kv.KVCache, jax.Array, jax.Array, jax.Array, jax.Array | None]:
  """steps_per_call decode steps over every slot of the dense cache (`decode_loop`)."""
  def extend(c, t_N, a_N):
    logits_NxV, c, experts_Nx1xLxk = kv.extend_routed(params, cfg, c, t_N[:, None], a_N[:, None])
    return logits_NxV, c, None if experts_Nx1xLxk is None else experts_Nx1xLxk[:, 0]

  return decode_loop(extend, lambda c: c.length_B, cache, token_N, active_N, budget_N, seed_N,
                     sampling)


def compile_steps(cfg: ModelConfig, sampler: SamplerConfig, stop_token_ids: tuple[int, ...],
                  mesh: jax.sharding.Mesh | None = None) -> Steps:
  """`prefill` and `decode` jitted with the configs bound and the cache donated
  (traced on `mesh` when given; shardings follow the inputs', and the outputs the
  host reads are replicated: `sharding.mesh.host_outputs`).

  Shapes are static per engine (N slots, max_seq_len, one chunk size per
  prefill bucket), so each program compiles once per bucket and never again.
  Engines whose model config, sampling knobs and mesh agree share the programs.
  """
  return _compiled(cfg, Sampling(float(sampler.temperature), sampler.top_k, float(sampler.top_p),
                                 sampler.steps_per_call, tuple(sorted(stop_token_ids))), mesh)


@functools.lru_cache(maxsize=None)
def _compiled(cfg: ModelConfig, sampling: Sampling, mesh: jax.sharding.Mesh | None) -> Steps:
  def jitted(program):
    program = functools.partial(program, cfg=cfg, sampling=sampling)
    return jax.jit(program if mesh is None else traced_on(mesh, host_outputs(mesh, program)), donate_argnums=1)

  return Steps(prefill=jitted(prefill), decode=jitted(decode))


def cache_shardings(cache, mesh: jax.sharding.Mesh):
  """Slots over the activation-batch axes, KV heads over tensor, the rest whole
  (axes that do not divide are left out)."""
  names = {0: (), 1: ("activation_batch",), 2: ("activation_batch", "cache_length"),
           4: ("activation_batch", "activation_kv_heads", "cache_length", "head_dim")}

  def one(leaf):
    if leaf.ndim not in names:
      raise ValueError(f"KV cache leaf of shape {leaf.shape} has no sharding; extend "
                       "sao_jax.sampler.steps.cache_shardings for it")
    spec = logical_to_spec(names[leaf.ndim], leaf.shape, dict(mesh.shape), strict=False)
    return jax.sharding.NamedSharding(mesh, spec)

  return jax.tree.map(one, cache)


def init_cache(cfg: ModelConfig, sampler: SamplerConfig) -> kv.KVCache:
  """An empty cache of `slots` rows of `max_seq_len` tokens."""
  return kv.init_cache(cfg, sampler.slots, sampler.max_seq_len)


def new_cache(cfg: ModelConfig, sampler: SamplerConfig,
              mesh: jax.sharding.Mesh | None = None) -> kv.KVCache:
  """`init_cache`, created sharded on `mesh` (`cache_shardings`)."""
  init = functools.partial(init_cache, cfg, sampler)
  if mesh is None:
    return init()
  return jax.jit(init, out_shardings=cache_shardings(jax.eval_shape(init), mesh))()


def abstract_decode_args(sampler: SamplerConfig, mesh: jax.sharding.Mesh):
  """The host arguments of `decode` after (params, cache), as the engine passes them
  (numpy: replicated), and its static keywords (none): for lowering."""
  host = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  arg = lambda dtype: jax.ShapeDtypeStruct((sampler.slots,), dtype, sharding=host)
  return (arg(jnp.int32), arg(jnp.bool_), arg(jnp.int32), arg(jnp.uint32)), {}


def cache_rows(sampler: SamplerConfig, seq_len: int) -> int:
  """Rows of `seq_len` tokens the cache's memory holds: its `slots`."""
  del seq_len  # a dense row is max_seq_len tokens whatever the plan's length
  return sampler.slots
