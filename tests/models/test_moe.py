"""Dropless MoE expert computation: against a dense every-expert reference, and
expert-parallel (shard_map) equal to one device on emulated meshes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.config import MeshConfig
from sao_jax.models import moe
from sao_jax.sharding.mesh import make_mesh

E, D, F, K = 8, 16, 12, 2


def _problem(batch, length, seed=0):
  keys = jax.random.split(jax.random.key(seed), 5)
  x = jax.random.normal(keys[0], (batch, length, D))
  logits = jax.random.normal(keys[1], (batch, length, E))
  weight, expert = jax.lax.top_k(jax.nn.softmax(logits), K)
  gate, up = (0.3 * jax.random.normal(k, (E, D, F)) for k in keys[2:4])
  down = 0.3 * jax.random.normal(keys[4], (E, F, D))
  return x, expert, weight, gate, up, down


def _dense_reference(x, expert, weight, gate, up, down):
  """Every expert on every token, weighted by the routing (zero if not chosen)."""
  x, expert, weight = (np.asarray(a, np.float64) for a in (x, expert, weight))
  gate, up, down = (np.asarray(a, np.float64) for a in (gate, up, down))
  y = np.zeros_like(x)
  for e in range(E):
    h = x @ gate[e]
    h = h / (1 + np.exp(-h)) * (x @ up[e])
    w = np.sum(np.where(expert == e, weight, 0.0), axis=-1, keepdims=True)
    y += w * (h @ down[e])
  return y


def test_expert_ffn_matches_dense_reference():
  x, expert, weight, gate, up, down = _problem(3, 5)
  y = moe.expert_ffn(x.reshape(15, D), expert.reshape(15, K), weight.reshape(15, K), gate, up, down)
  np.testing.assert_allclose(y.reshape(3, 5, D), _dense_reference(x, expert, weight, gate, up, down),
                             atol=1e-5)


def test_disjoint_expert_ranges_sum_to_the_whole():
  x, expert, weight, gate, up, down = _problem(2, 6)
  flat = (x.reshape(12, D), expert.reshape(12, K), weight.reshape(12, K))
  whole = moe.expert_ffn(*flat, gate, up, down)
  parts = [moe.expert_ffn(*flat, gate[s:s + 3], up[s:s + 3], down[s:s + 3], first_expert=s)
           for s in (0, 3, 6)]
  np.testing.assert_allclose(sum(parts), whole, atol=1e-6)


def _loss(x, expert, weight, gate, up, down):
  y = moe.expert_parallel_ffn(x, expert, weight, gate, up, down)
  return jnp.sum(jnp.sin(y)), y


# (mesh, batch): tokens gathered over the expert group and reduce-scattered back;
# tokens replicated over the expert axis (batch 2 does not divide fsdp x expert);
# MLP width split over tensor (partial outputs summed).
MESHES = [(MeshConfig(fsdp=2, tensor=1, expert=4), 8), (MeshConfig(fsdp=2, tensor=1, expert=4), 2),
          (MeshConfig(fsdp=1, tensor=2, expert=4), 4), (MeshConfig(data=2, fsdp=-1, tensor=1), 4)]


@pytest.mark.parametrize("mesh_cfg,batch", MESHES,
                         ids=["gathered", "replicated_tokens", "tensor_split", "no_expert_axis"])
def test_expert_parallel_equals_one_device(mesh_cfg, batch):
  args = _problem(batch, 4, seed=batch)
  grad = jax.value_and_grad(_loss, argnums=(0, 2, 3, 4, 5), has_aux=True)
  (ref_loss, ref_y), ref_grads = jax.jit(grad)(*args)
  np.testing.assert_allclose(ref_y, _dense_reference(*args), atol=1e-5)
  mesh = make_mesh(mesh_cfg)
  with jax.set_mesh(mesh):
    sharded = jax.jit(grad)
    (loss, y), grads = sharded(*args)
    hlo = sharded.lower(*args).as_text()
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  np.testing.assert_allclose(y, ref_y, atol=1e-5)
  for name, g, r in zip(("x", "weight", "gate", "up", "down"), grads, ref_grads):
    np.testing.assert_allclose(g, r, atol=1e-5, err_msg=name)
  if mesh_cfg.expert > 1 and batch % (mesh_cfg.fsdp * mesh_cfg.expert) == 0:
    # Each device routes its expert group's tokens and hands the outputs back.
    assert "all_gather" in hlo and "reduce_scatter" in hlo


def test_load_balancing_loss_matches_transformers():
  """Qwen3-MoE's router aux loss (transformers' load_balancing_loss_func, with the
  attention mask excluding padding) on the same router logits."""
  torch = pytest.importorskip("torch")
  from transformers.models.qwen3_moe import modeling_qwen3_moe

  batch, length, layers = 3, 7, 3
  keys = jax.random.split(jax.random.key(1), layers)
  # Skewed logits so the loss is far from its balanced value K.
  logits = tuple(jax.random.normal(k, (batch, length, E)) * 2.0 + jnp.arange(E)[None, None] * 0.3
                 for k in keys)
  seg = np.ones((batch, length), np.int32)
  seg[1, 5:] = 0
  seg[2, 2:] = 0
  got = moe.load_balancing_loss(logits, jnp.asarray(seg), K)
  want = modeling_qwen3_moe.load_balancing_loss_func(
      tuple(torch.from_numpy(np.asarray(l).reshape(batch * length, E)) for l in logits),
      num_experts=E, top_k=K, attention_mask=torch.from_numpy(seg))
  np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
  assert float(got) > K * 1.05  # unbalanced routing costs more than balance (K)
  assert float(moe.load_balancing_loss((), jnp.asarray(seg), K)) == 0.0
