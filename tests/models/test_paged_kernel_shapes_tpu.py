"""`paged_kernel.kernel_unsupported` is exactly what libtpu compiles (slow; needs libtpu, no
TPU): over head_dim {64, 128, 256} x KV heads per device {1, 2, 4, 8} x pages of {16,
64, 256} tokens, decode and prefill, on v5e, v5p and v6e, every shape it takes compiles
with the block sizes a run uses (`paged_blocks.kernel_blocks`), and every shape it
refuses names its reason and does fail to compile (head_dim 64: the kernel's own trace
fails; head_dim 256 with 2 or more KV heads per device in bfloat16: Mosaic's strided
load, "The last dim size is not 128 in original base memref"). The 108 shapes took 46
minutes on a shared, loaded 2-core machine (about 12 CPU-minutes); run them with
`-m slow` and `nice`."""

import os

import jax
import jax.numpy as jnp
import pytest

from sao_jax.config import MeshConfig, ModelConfig
from sao_jax.config.sampler import SamplerConfig
from sao_jax.models.paged_blocks import KernelShapes, generation_of, kernel_blocks
from sao_jax.models.paged_kernel import kernel_attention, kernel_unsupported, record_blocks
from sao_jax.sampler.paged_steps import attention_choice
from sao_jax.sharding.mesh import make_mesh

pytestmark = [pytest.mark.slow, pytest.mark.tpu_compile]

TOPOLOGIES = ["v5e:2x2", "v5p:2x2x1", "v6e:2x4"]
HEAD_DIMS = [64, 128, 256]
KV_HEADS = [1, 2, 4, 8]  # per device
PAGES = [16, 64, 256]
GROUP = 2  # query heads per KV head, as Gemma 3 4B and 12B
# VMEM does not depend on the pool's size. The page table is prefetched into the core's
# 1 MiB of SMEM: 512 rows x 4096 / 16 pages of int32 is half of it (at 8192 tokens
# libtpu refuses pages of 16: "Ran out of memory in memory space smem").
MAX_LEN, POOL_PAGES = 4096, 64
# (rows, query tokens per row): 512 decode slots; a batched prefill of 4 x 2048 tokens.
CALLS = {"decode": (512, 1), "prefill": (4, 2048)}
DTYPE = jnp.bfloat16  # the sampler's compute and pool dtype


def _devices(topology):
  pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu: "
                      "pip install 'jax[tpu]==<jax version>'")
  from sao_jax.planning import hardware
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  return hardware.topology_devices(topology)


def _compile(device, head_dim, kv_heads, page, rows, chunk):
  """kernel_attention on one device's shapes, compiled for `device` with the run's block
  sizes; -> the KernelBlocks it traced with."""
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(
      shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))
  args = (spec((rows, chunk, GROUP * kv_heads, head_dim), DTYPE),
          spec((POOL_PAGES, page, 2 * kv_heads, head_dim), DTYPE),
          spec((rows, chunk), jnp.bool_), spec((rows,), jnp.int32),
          spec((rows, MAX_LEN // page), jnp.int32))
  with jax.default_device(device), record_blocks() as used:
    jax.jit(kernel_attention).lower(*args).compile()
  return used


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("kv_heads", KV_HEADS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_kernel_unsupported_is_what_libtpu_compiles(topology, head_dim, kv_heads, page):
  device = _devices(topology)[0]
  generation = generation_of(device.device_kind)
  assert generation == topology.split(":")[0]
  reason = kernel_unsupported(GROUP * kv_heads, kv_heads, head_dim, DTYPE)
  for call, (rows, chunk) in CALLS.items():
    if reason is None:
      shapes = KernelShapes(page_size=page, pages_per_seq=MAX_LEN // page,
                            num_q_tokens=rows * chunk, num_q_heads=GROUP * kv_heads,
                            num_kv_heads=kv_heads, head_dim=head_dim, q_dtype=DTYPE,
                            kv_dtype=DTYPE)
      assert _compile(device, head_dim, kv_heads, page, rows, chunk) == [
          kernel_blocks(generation, shapes)], call
      continue
    assert reason.startswith(f"head_dim={head_dim}"), reason
    if head_dim % 128:
      assert "is not a multiple of 128" in reason
      # The kernel's broadcast of [rows, 128] softmax statistics fails at trace.
      failure, match = AssertionError, None
    else:
      assert f"with {kv_heads} KV head(s) per device" in reason
      # jax's MosaicError (private) from the Mosaic compiler.
      failure, match = Exception, "The last dim size is not 128 in original base memref"
    with pytest.raises(failure, match=match):
      _compile(device, head_dim, kv_heads, page, rows, chunk)


# Gemma 3 4B's attention: 8 query heads, 4 KV heads of 256 (configs/gemma3_4b.py).
GEMMA3_4B = ModelConfig(vocab_size=1024, hidden_size=512, intermediate_size=512,
                        num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=4,
                        head_dim=256, compute_dtype="bfloat16", param_dtype="bfloat16")


@pytest.mark.parametrize("topology, path", [("v6e:1x4", "pallas"), ("v5p:1x2x1", "reference")])
def test_auto_takes_the_kernel_where_libtpu_compiles_it_and_says_why_not(topology, path):
  """A ready host's sampler (tensor over its chips): on a v6e-8's 4 each holds one KV head
  and "auto" runs the kernel; on a v5p-8's 2 each holds 2, which libtpu cannot compile,
  so "auto" takes the reference path and the reason names the shapes."""
  mesh = make_mesh(MeshConfig(data=1, fsdp=1, tensor=-1, expert=1), _devices(topology))
  got, why = attention_choice(SamplerConfig(), GEMMA3_4B, mesh)
  assert got == path
  if path == "reference":
    assert why == ("sampler.paged_attention='auto' on tpu, and the Pallas kernel does not take "
                   "this model's attention on 2 KV-head shard(s): " +
                   kernel_unsupported(4, 2, 256, jnp.bfloat16))
  else:
    assert why == "sampler.paged_attention='auto' on tpu"
