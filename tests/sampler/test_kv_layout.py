"""The KV-layout seam (`sao_jax.sampler.kv_layout`): one table from `sampler.kv_layout` to
the engine class, its device programs, cache and shardings, used by `make_engine` and by
the planner."""

import dataclasses

import jax
import pytest

from sao_jax.config import Config, MeshConfig, ModelConfig
from sao_jax.config.sampler import KV_LAYOUTS, SamplerConfig
from sao_jax.models import transformer
from sao_jax.planning import aot
from sao_jax.sampler import paged_steps, steps
from sao_jax.sampler.engine import Engine
from sao_jax.sampler.kv_layout import LAYOUTS, kv_layout
from sao_jax.sampler.paged_engine import PagedEngine
from sao_jax.sharding.mesh import make_mesh

MODEL = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8)
SAMPLER = SamplerConfig(slots=4, max_seq_len=32, prefill_buckets=(8,), kv_page_size=8,
                        stop_patterns=())


def test_each_configurable_layout_has_one_entry():
  assert sorted(LAYOUTS) == sorted(KV_LAYOUTS)
  paged, dense = kv_layout(SAMPLER), kv_layout(dataclasses.replace(SAMPLER, kv_layout="dense"))
  assert (paged.engine, paged.programs, paged.plan_program) == (PagedEngine, paged_steps,
                                                                "paged_decode")
  assert (dense.engine, dense.programs, dense.plan_program) == (Engine, steps, None)
  with pytest.raises(ValueError, match="sampler.kv_layout='ring' is invalid"):
    kv_layout(dataclasses.replace(SAMPLER, kv_layout="ring"))


def test_an_engine_refuses_another_layouts_config():
  params = transformer.init_params(MODEL, jax.random.key(0))
  with pytest.raises(ValueError, match="sampler.kv_layout='paged' is not the layout of Engine "
                                       r"\('dense'\): build engines with .*make_engine"):
    Engine(SAMPLER, MODEL, params)
  with pytest.raises(ValueError, match="not the layout of PagedEngine"):
    PagedEngine(dataclasses.replace(SAMPLER, kv_layout="dense"), MODEL, params)


@pytest.mark.parametrize("layout", ["paged", "dense"])
def test_the_planners_abstract_cache_is_the_engines_cache(layout):
  """What the planner lowers on (shapes, dtypes, shardings) is what the engine allocates."""
  sampler = dataclasses.replace(SAMPLER, kv_layout=layout, sharded=True,
                                mesh=MeshConfig(fsdp=2, tensor=2))
  mesh = make_mesh(sampler.mesh, jax.devices()[:4])
  chosen = kv_layout(sampler)
  real = chosen.programs.new_cache(MODEL, sampler, mesh)
  abstract = chosen.abstract_cache(MODEL, sampler, mesh)
  for got, want in zip(jax.tree.leaves(abstract), jax.tree.leaves(real)):
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    assert got.sharding.is_equivalent_to(want.sharding, want.ndim)


def test_dense_rows_compare_at_the_engines_kv_memory():
  cfg = Config(model=MODEL, sampler=dataclasses.replace(SAMPLER, kv_pages=32))
  assert aot.dense_rows(cfg, 32) == 8  # 32 pages of 8 tokens = 8 rows of 32, not the 4 slots
  dense = dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, kv_layout="dense"))
  assert aot.dense_rows(dense, 32) == SAMPLER.slots
