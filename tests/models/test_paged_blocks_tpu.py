"""The Pallas ragged paged attention kernel compiled by libtpu for TPU topologies at the
pod configs' per-chip shapes (slow; needs libtpu, no TPU): with the block sizes a run
uses (`paged_blocks.kernel_blocks`) it compiles within VMEM on v5p and v5e, alone and
inside the paged decode step; at the VMEM model's own need as the limit it still
compiles (the model bounds the compiler's use); and jax's own off-table choice,
128 pages x 32 queries, does not fit (the failure this replaced)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.config import AlgorithmConfig, Config, LearnerConfig, MeshConfig, ModelConfig
from sao_jax.config.sampler import SamplerConfig
from sao_jax.models.paged_blocks import (KernelBlocks, KernelShapes, generation_of, kernel_blocks,
                                         vmem_need)
from sao_jax.models.paged_kernel import kernel_attention, record_blocks

pytestmark = [pytest.mark.slow, pytest.mark.tpu_compile]

TOPOLOGIES = ["v5p:2x2x1", "v5e:2x2"]
# Per chip on a tensor=4 sampler host: 32 query heads / 4, KV heads 8 / 4 (8B), 4 / 4 (30B).
POD_KV_HEADS = {"8b": 8, "30b": 4}
SLOTS, MAX_LEN, PAGE = 512, 32768, 256


def _device(topology):
  pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu: "
                      "pip install 'jax[tpu]==<jax version>'")
  from sao_jax.planning import hardware
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  return hardware.topology_devices(topology)


def _shapes(config, tokens):
  return KernelShapes(page_size=PAGE, pages_per_seq=MAX_LEN // PAGE, num_q_tokens=tokens,
                      num_q_heads=8, num_kv_heads=POD_KV_HEADS[config] // 4, head_dim=128,
                      q_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16)


def _compile_kernel(device, shapes, rows, chunk, blocks=None):
  """kernel_attention over rows x chunk query slots, a 256-page pool (VMEM does not depend
  on the pool's size), compiled for `device`; -> the KernelBlocks it traced with."""
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(
      shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))
  kv2 = 2 * shapes.num_kv_heads
  args = (spec((rows, chunk, shapes.num_q_heads, 128), jnp.bfloat16),
          spec((256, PAGE, kv2, 128), jnp.bfloat16), spec((rows, chunk), jnp.bool_),
          spec((rows,), jnp.int32), spec((rows, shapes.pages_per_seq), jnp.int32))
  attend = lambda *a: kernel_attention(*a, blocks=blocks)
  with jax.default_device(device), record_blocks() as used:
    jax.jit(attend).lower(*args).compile()
  return used


@pytest.mark.parametrize("config", sorted(POD_KV_HEADS))
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_kernel_compiles_within_vmem_with_the_run_sizes(topology, config):
  device = _device(topology)[0]
  generation = generation_of(device.device_kind)
  assert generation == topology.split(":")[0]
  decode, prefill = _shapes(config, SLOTS), _shapes(config, 4 * 8192)
  # Decode (one query per slot) and a batched prefill of 4 rows of 8,192 tokens.
  assert _compile_kernel(device, decode, SLOTS, 1) == [kernel_blocks(generation, decode)]
  assert _compile_kernel(device, prefill, 4, 8192) == [kernel_blocks(generation, prefill)]
  # The VMEM model bounds what the compiler takes: its need as the limit still compiles.
  run = kernel_blocks(generation, decode)
  tight = run._replace(vmem_limit_bytes=vmem_need(decode, *run[:2]))
  assert _compile_kernel(device, decode, SLOTS, 1, blocks=tight) == [tight]


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_jax_default_block_sizes_do_not_fit_vmem(topology):
  """What the kernel ran with before (sizes None on a TPU): these shapes are not in jax's
  tuned table, whose default is 128 pages x 32 queries, a 32K-token KV block."""
  from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes as tuned
  device = _device(topology)[0]
  shapes = _shapes("8b", SLOTS)
  key = tuned.simplify_key((jnp.bfloat16, jnp.bfloat16, 8, 2, 128, PAGE, SLOTS, 128))
  assert key not in tuned.TUNED_BLOCK_SIZES["TPU v5"]
  old = KernelBlocks(128, 32, None)
  with pytest.raises(jax.errors.JaxRuntimeError, match="(?i)vmem"):
    _compile_kernel(device, shapes, SLOTS, 1, blocks=old)


def _pod_attention_config(config):
  """One layer with the pod config's attention (32 query heads of 128, its KV heads),
  small elsewhere: what VMEM depends on, at a fraction of the compile."""
  model = ModelConfig(vocab_size=1024, hidden_size=512, intermediate_size=512,
                      num_hidden_layers=1, num_attention_heads=32,
                      num_key_value_heads=POD_KV_HEADS[config], head_dim=128,
                      param_dtype="bfloat16", compute_dtype="bfloat16", logits_chunk=512)
  sampler = SamplerConfig(slots=SLOTS, max_seq_len=MAX_LEN, prefill_buckets=(512,),
                          kv_page_size=PAGE, kv_pages=256, sharded=True,
                          mesh=MeshConfig(data=1, fsdp=1, tensor=4, expert=1))
  return Config(name=f"pod_attention_{config}", model=model, sampler=sampler,
                algorithm=AlgorithmConfig.for_variant("sao"),
                learner=LearnerConfig(batch_trajectories=8, micro_batches=2))


@pytest.mark.parametrize("config", sorted(POD_KV_HEADS))
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_paged_decode_step_compiles_with_the_run_sizes(topology, config):
  """The engine's decode call (`paged_steps.decode`, 8 steps over 512 slots), traced on a
  tensor=4 mesh of the topology as sao-plan and a sampler host trace it: the kernel
  gets the per-chip shapes and the run's sizes, and the program compiles."""
  from sao_jax.planning import aot
  from sao_jax.sharding.mesh import make_mesh
  cfg = _pod_attention_config(config)
  mesh = make_mesh(cfg.sampler_mesh(), _device(topology))
  with record_blocks() as used:
    lowered = aot.lower_engine_decode(cfg, mesh, SLOTS, 256, MAX_LEN)
  generation = topology.split(":")[0]
  assert set(used) == {kernel_blocks(generation, _shapes(config, SLOTS))}
  compiled = lowered.compile()
  assert "ragged_paged_attention_kernel" in compiled.as_text()
  assert np.isfinite(compiled.memory_analysis().temp_size_in_bytes)
