"""The Pallas splash attention kernel compiled by libtpu for TPU topologies (slow; needs
libtpu, no TPU): at the pod configs' per-chip shapes (one 32K-token row per chip, 32 query
heads of 128, 8 or 4 KV heads; configs/qwen3_8b_v5p32.py, qwen3_30b_a3b_v5p128.py) the
learner's attention under `model.attention_impl="auto"` takes the kernel with the run's
blocks, and its forward and both backward kernels compile on v5e, v5p and v6e;
`splash.splash_unsupported` is what libtpu compiles over head_dim and block size; and
sao-plan's train step is the one that runs the kernel."""

import os

import jax
import jax.numpy as jnp
import pytest

from sao_jax.config import AlgorithmConfig, Config, LearnerConfig, MeshConfig, ModelConfig
from sao_jax.learner import compile as compile_lib
from sao_jax.models import attention, forward, splash
from sao_jax.sharding.mesh import make_mesh, traced_on
from sao_jax.sharding.rules import logical_sharding

pytestmark = [pytest.mark.slow, pytest.mark.tpu_compile]

TOPOLOGIES = ["v5e:2x2", "v5p:2x2x1", "v6e:2x4"]
POD_KV_HEADS = {"8b": 8, "30b": 4}
POD_SEQ, POD_BLOCK, HEADS = 32768, 512, 32
KERNELS = ("splash_mha_fwd_segmented_residuals", "splash_mha_dq_segmented",
           "splash_mha_dkv_segmented")


def _devices(topology):
  pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu: "
                      "pip install 'jax[tpu]==<jax version>'")
  from sao_jax.planning import hardware
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  return hardware.topology_devices(topology)


def _fsdp_mesh(devices):
  return make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1, expert=1), devices)


def _attention_grads(mesh, rows, seq, kv_heads, head_dim, impl, block, window=None,
                     attend=None):
  """Forward and backward of `attend` (default: the model's `attention.attend` with impl and
  block) on [rows, seq] bfloat16 q/k/v laid out as the learner's activations on `mesh`;
  -> the compiled program's text."""
  axes = ("activation_batch", "activation_length", "activation_heads", "head_dim")
  arg = lambda shape, dtype, names: jax.ShapeDtypeStruct(
      shape, dtype, sharding=logical_sharding(mesh, names, shape))
  args = (arg((rows, seq, HEADS, head_dim), jnp.bfloat16, axes),
          arg((rows, seq, kv_heads, head_dim), jnp.bfloat16, axes[:2] + ("activation_kv_heads",
                                                                          "head_dim")),
          arg((rows, seq, kv_heads, head_dim), jnp.bfloat16, axes[:2] + ("activation_kv_heads",
                                                                          "head_dim")),
          arg((rows, seq), jnp.int32, axes[:2]))
  if attend is None:
    attend = lambda q, k, v, seg: attention.attend(
        q, k, v, attention.CausalMask(seg, forward.positions(seg)).windowed(window), impl, block)

  def grads(q, k, v, seg):
    loss = lambda q, k, v: jnp.sum(attend(q, k, v, seg).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  return jax.jit(traced_on(mesh, grads)).lower(*args).compile().as_text()


@pytest.mark.parametrize("config", sorted(POD_KV_HEADS))
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_pod_attention_takes_the_kernel_and_compiles(topology, config):
  mesh = _fsdp_mesh(_devices(topology))
  rows = mesh.size  # one 32K-token row per chip in each micro-batch, as the pod configs
  shapes = splash.SplashShapes(rows, POD_SEQ, HEADS, POD_KV_HEADS[config], 128)
  choice = splash.choose("auto", POD_BLOCK, mesh.devices.flat[0], dict(mesh.shape), shapes)
  assert choice == splash.Choice("splash", "model.attention_impl='auto' on tpu",
                                 splash.splash_blocks(POD_BLOCK, POD_SEQ))
  text = _attention_grads(mesh, rows, POD_SEQ, POD_KV_HEADS[config], 128, "auto", POD_BLOCK)
  for name in KERNELS:
    assert name in text, name


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_gemma3_local_layer_compiles(topology):
  """Gemma 3 4B's KV heads and head_dim (4 of 256) in its sliding window of 1024, at 8K
  tokens on one chip: the window's mask takes the same kernels."""
  mesh = _fsdp_mesh(_devices(topology)[:1])
  text = _attention_grads(mesh, 1, 8192, 4, 256, "splash", POD_BLOCK, window=1024)
  for name in KERNELS:
    assert name in text, name


@pytest.mark.parametrize("head_dim, block", [(64, 512), (128, 512), (256, 512), (128, 1024),
                                             (128, 2048)])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_splash_unsupported_is_what_libtpu_compiles(topology, head_dim, block):
  """The kernel called directly (no refusal in between) at 8K tokens on one chip: every
  head_dim and block `splash_unsupported` takes compiles (on v5e, under load: 89 to 201 s
  each); blocks of 2048 run out of v5e's VMEM ("CompileTimeScopedVmemOom")."""
  mesh = _fsdp_mesh(_devices(topology)[:1])
  shapes = splash.SplashShapes(1, 8192, HEADS, 8, head_dim)
  reason = splash.splash_unsupported(block, dict(mesh.shape), shapes)
  direct = lambda q, k, v, seg: splash.splash_attention(q, k, v, seg, None,
                                                        splash.splash_blocks(block, 8192))
  compile_it = lambda: _attention_grads(mesh, 1, 8192, 8, head_dim, None, None, attend=direct)
  if reason is None:
    assert all(name in compile_it() for name in KERNELS)
  elif topology.startswith("v5e"):
    assert reason.startswith(f"model.attention_block={block} is over")
    with pytest.raises(jax.errors.JaxRuntimeError, match="CompileTimeScopedVmemOom"):
      compile_it()


def _pod_attention_config(seq_len):
  """One layer with the 8B pod config's attention, small elsewhere, attention_impl auto."""
  model = ModelConfig(vocab_size=1024, hidden_size=512, intermediate_size=512,
                      num_hidden_layers=1, num_attention_heads=HEADS, num_key_value_heads=8,
                      head_dim=128, param_dtype="bfloat16", compute_dtype="bfloat16",
                      logits_chunk=512, attention_impl="auto", attention_block=POD_BLOCK,
                      remat_policy="full", max_position_embeddings=seq_len)
  return Config(name="pod_attention_splash", model=model,
                algorithm=AlgorithmConfig.for_variant("sao"),
                learner=LearnerConfig(batch_trajectories=8, micro_batches=2))


def test_plan_compiles_the_train_step_the_learner_runs():
  """sao-plan's train step (`aot.lower_train`, the learner's own jit) runs the kernel, and
  the plan states the learner's choice (`compile.learner_attention`)."""
  from sao_jax.planning import aot
  seq = 8192
  cfg = _pod_attention_config(seq)
  mesh = _fsdp_mesh(_devices("v5p:2x2x1"))
  choice = compile_lib.learner_attention(cfg, mesh, seq)
  assert choice == splash.Choice("splash", "model.attention_impl='auto' on tpu",
                                 splash.splash_blocks(POD_BLOCK, seq))
  text = aot.lower_train(cfg, mesh, seq).compile().as_text()
  for name in KERNELS:
    assert name in text, name
  result = aot.plan(cfg, "v5p:2x2x1", seq, with_decode=False)
  assert result.learner_attention == choice.describe()
  assert f"train_step attention on v5p: {choice.describe()}" in aot.format_plan(result)
