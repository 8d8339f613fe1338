"""The KV-layout seam: what `sampler.kv_layout` selects, in one table.

  layout = kv_layout(sampler)        -> KVLayout of sampler.kv_layout ("paged" or "dense")
  layout.engine                      -> the host engine class (PagedEngine, Engine)
  layout.programs                    -> its device programs' module (paged_steps, steps):
      compile_steps(model_cfg, sampler, stop_token_ids, mesh) -> (prefill, decode), jitted
      init_cache(model_cfg, sampler) / new_cache(model_cfg, sampler, mesh) -> empty cache
      cache_shardings(cache, mesh)   -> the cache's NamedShardings
      abstract_decode_args(sampler, mesh) -> decode's host arguments, for lowering
      cache_rows(sampler, seq_len)   -> rows of seq_len tokens the cache's memory holds
  layout.plan_program                -> the plan row compiling the engine's decode call, or None

The engine builder (`sao_jax.sampler.episodes.make_engine`) and the planner
(`sao_jax.planning.aot`) both go through `kv_layout`, so a new layout is one
entry here (an engine class whose `programs` implement the interface above).
Each engine class names its own programs (`Engine.programs`), so an engine built
directly (`PagedEngine(...)`) runs the same programs the table lists.

"paged" is the sampler's layout. "dense" is kept as the exactness reference the
paged engine is tested against (same tokens and behavior_logp) and for runs
whose every episode fills max_seq_len (no page bookkeeping); its decode call is
the dense model step the plan compiles as its baseline (`decode_step`), so it
has no plan row of its own.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from sao_jax.config import ModelConfig
from sao_jax.config.sampler import SamplerConfig
from sao_jax.sampler.engine import Engine
from sao_jax.sampler.paged_engine import PagedEngine


@dataclasses.dataclass(frozen=True)
class KVLayout:
  engine: type[Engine]
  plan_program: str | None  # sao-plan's row for the engine's own decode call

  @property
  def name(self) -> str:
    return self.engine.kv_layout

  @property
  def programs(self):
    return self.engine.programs

  def abstract_cache(self, model_cfg: ModelConfig, sampler: SamplerConfig,
                     mesh: jax.sharding.Mesh):
    """The empty cache as ShapeDtypeStructs carrying its shardings on `mesh` (nothing
    allocated: the planner lowers on these)."""
    shapes = jax.eval_shape(functools.partial(self.programs.init_cache, model_cfg, sampler))
    return jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                                    sharding=sharding),
                        shapes, self.programs.cache_shardings(shapes, mesh))


LAYOUTS = {layout.name: layout for layout in (KVLayout(PagedEngine, plan_program="paged_decode"),
                                              KVLayout(Engine, plan_program=None))}


def kv_layout(sampler: SamplerConfig) -> KVLayout:
  """The layout `sampler.kv_layout` names."""
  if sampler.kv_layout not in LAYOUTS:
    raise ValueError(f"sampler.kv_layout={sampler.kv_layout!r} is invalid: expected one of "
                     f"{', '.join(LAYOUTS)}")
  return LAYOUTS[sampler.kv_layout]
