"""`sao_jax.models.paged_blocks`: the Pallas kernel's block sizes from a VMEM budget per TPU
generation, tightened by jax's tuned table, and the generation read from the devices a
program is traced for. (Compiled for TPU topologies: test_paged_blocks_tpu.py, slow.)"""

import jax.numpy as jnp
import pytest
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes as tuned

from sao_jax.models import paged_blocks
from sao_jax.models.paged_blocks import KernelShapes, kernel_blocks, vmem_need

MiB = 2**20
# The pod configs' per-chip decode call on a tensor=4 sampler host: 512 slots, pages of
# 256 tokens, 128 pages per 32K-token slot, 8 query heads; 8B: 2 KV heads, 30B: 1.
POD_8B = KernelShapes(page_size=256, pages_per_seq=128, num_q_tokens=512, num_q_heads=8,
                      num_kv_heads=2, head_dim=128, q_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16)
POD_30B = POD_8B._replace(num_kv_heads=1)


def test_device_kinds_name_their_generation():
  assert paged_blocks.generation_of("TPU v5") == "v5p"
  assert paged_blocks.generation_of("TPU v5 lite") == "v5e"
  assert paged_blocks.generation_of("TPU v6 lite") == "v6e"
  assert paged_blocks.generation_of("TPU v4") == "v4"
  assert paged_blocks.generation_of("cpu") is None
  assert paged_blocks.trace_generation() is None  # this CPU machine: interpret sizes


def test_the_vmem_model_counts_the_double_buffered_kv_block():
  # 16 pages x 256 tokens x 4 combined heads x 128 x 2 bytes = 4 MiB, twice.
  base = vmem_need(POD_8B, 1, 32)
  assert vmem_need(POD_8B, 17, 32) - base >= 16 * 2 * 256 * 4 * 128 * 2
  assert vmem_need(POD_8B, 16, 32) > 8 * MiB
  # jax's off-table default, 128 pages x 32 queries: the KV double buffer alone is 64 MiB.
  assert vmem_need(POD_8B, 128, 32) > 64 * MiB


@pytest.mark.parametrize("shapes", [POD_8B, POD_30B], ids=["8b", "30b"])
def test_pod_decode_blocks_fit_each_generations_budget(shapes):
  for generation, vmem in paged_blocks.VMEM_BYTES.items():
    blocks = kernel_blocks(generation, shapes)
    assert blocks.vmem_limit_bytes == int(vmem * paged_blocks.VMEM_BUDGET_FRACTION)
    assert vmem_need(shapes, blocks.num_kv_pages_per_block,
                     blocks.num_queries_per_block) <= blocks.vmem_limit_bytes
    assert blocks.num_kv_pages_per_block * shapes.page_size <= paged_blocks.MAX_KEYS_PER_BLOCK
  # v5p (64 MiB VMEM, 48 budgeted): 16 pages of 256 = 4096 keys a block, 32 queries.
  assert kernel_blocks("v5p", shapes)[:2] == (16, 32)
  # v4 (16 MiB, 12 budgeted) takes smaller blocks, within its budget.
  assert kernel_blocks("v4", shapes).num_kv_pages_per_block < 16


def test_short_rows_and_few_tokens_bound_the_blocks():
  short = POD_8B._replace(pages_per_seq=3, num_q_tokens=5)
  assert kernel_blocks("v5p", short)[:2] == (3, 5)
  assert kernel_blocks(None, POD_8B) == (16, 32, None)  # off a TPU: interpret sizes
  assert kernel_blocks(None, short) == (3, 5, None)


def test_the_tuned_table_tightens_where_it_has_the_shapes():
  """jax's v5 table has (bf16, bf16, 4 query heads and 1 KV head per block, 128, pages of
  256, 2048 tokens, 2048-token rows) -> (4 pages, 64 queries): the budget alone gives 8
  pages (the whole row) and 32 queries; the table tightens the pages, not the queries."""
  shapes = POD_8B._replace(pages_per_seq=8, num_q_tokens=2048, num_q_heads=4, num_kv_heads=1)
  key = ("bfloat16", "bfloat16", 4, 1, 128, 256, 2048, 2048)
  assert tuned.TUNED_BLOCK_SIZES["TPU v5"][key] == (4, 64)
  assert kernel_blocks("v5p", shapes)[:2] == (4, 32)
  assert kernel_blocks("v5e", shapes)[:2] == (4, 32)  # one "TPU v5" table for both


def test_no_block_fits_names_the_fix():
  huge_pages = POD_8B._replace(page_size=16384, pages_per_seq=2)
  with pytest.raises(ValueError, match=r"over the 12 MiB budget of a v4 core; use a smaller "
                                       r"sampler.kv_page_size"):
    kernel_blocks("v4", huge_pages)
  with pytest.raises(ValueError, match="TPU generation 'v9' has no VMEM budget"):
    kernel_blocks("v9", POD_8B)
