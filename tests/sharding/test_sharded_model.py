"""The model on an emulated 2x4 mesh: params sharded as the rules say, and the
sharded forward/backward equal to the single-device one."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.config import MeshConfig, ModelConfig
from sao_jax.models import forward, params_io, transformer, value
from sao_jax.sharding.mesh import make_mesh
from sao_jax.sharding.rules import logical_sharding

DENSE = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, head_dim=8,
                    num_attention_heads=8, num_key_value_heads=4, logits_chunk=4)
MOE = dataclasses.replace(DENSE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          tie_word_embeddings=False)
# Gemma 3: a local layer (window 3 < the 8-token rows) and a global one, four norms each.
GEMMA3 = dataclasses.replace(DENSE, family="gemma3", sliding_window=3, query_pre_attn_scalar=12,
                             layer_types=("sliding_attention", "full_attention"))
FSDP_TENSOR = MeshConfig(fsdp=2, tensor=4)
FSDP_EXPERT = MeshConfig(fsdp=2, tensor=1, expert=4)


def _strip(spec):
  """Spec as a tuple without trailing Nones (P('a', None) and P('a') shard alike)."""
  parts = list(spec)
  while parts and parts[-1] is None:
    parts.pop()
  return tuple(parts)


EXPECTED = {
    (False, "fsdp_tensor"): {"embed": ("tensor", "fsdp"), "layers/0/attn/q_proj": ("fsdp", "tensor"),
                             "layers/0/attn/k_proj": ("fsdp", "tensor"),
                             "layers/0/attn/o_proj": ("tensor", None, "fsdp"),
                             "layers/1/mlp/gate_proj": ("fsdp", "tensor"),
                             "layers/1/mlp/down_proj": ("tensor", "fsdp"),
                             "layers/0/attn/q_norm/scale": (), "final_norm/scale": ()},
    (False, "gemma3"): {"layers/0/attn/q_proj": ("fsdp", "tensor"),
                        "layers/1/attn/o_proj": ("tensor", None, "fsdp"),
                        "layers/0/pre_mlp_norm/scale": (), "layers/1/post_mlp_norm/scale": (),
                        "layers/0/attn/k_norm/scale": ()},
    (True, "fsdp_tensor"): {"lm_head": ("fsdp", "tensor"), "layers/0/mlp/router": ("fsdp",),
                            "layers/0/mlp/gate_proj": (None, "fsdp", "tensor"),
                            "layers/0/mlp/down_proj": (None, "tensor", "fsdp")},
    (True, "fsdp_expert"): {"lm_head": ("fsdp",), "layers/0/mlp/router": ("fsdp", "expert"),
                            "layers/0/mlp/gate_proj": ("expert", "fsdp"),
                            "layers/0/mlp/down_proj": ("expert", None, "fsdp"),
                            "layers/0/attn/q_proj": ("fsdp",)},
}
CASES = [(DENSE, FSDP_TENSOR, "fsdp_tensor"), (MOE, FSDP_TENSOR, "fsdp_tensor"),
         (MOE, FSDP_EXPERT, "fsdp_expert"),
         pytest.param(GEMMA3, FSDP_TENSOR, "gemma3", marks=pytest.mark.slow)]


def _batch():
  tokens = jax.random.randint(jax.random.key(1), (8, 8), 0, 256)
  mask = jnp.ones((8, 8), jnp.int32).at[0, :3].set(0).at[5, -2:].set(0)
  return tokens, mask


def _loss(params, cfg, tokens, mask):
  out = forward.policy_forward(params, cfg, tokens, mask)
  return jnp.sum(out.logp_BxT) + 0.1 * jnp.sum(out.entropy_BxT), out


@pytest.mark.parametrize("cfg,mesh_cfg,layout", CASES,
                         ids=["dense", "moe", "moe_expert_parallel", "gemma3"])
def test_sharded_forward_and_grad_match_unsharded(cfg, mesh_cfg, layout):
  mesh = make_mesh(mesh_cfg)
  params = transformer.init_params(cfg, jax.random.key(0), mesh=mesh)
  specs = {transformer.param_path(kp): leaf.sharding.spec
           for kp, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  for path, want in EXPECTED[(bool(cfg.num_experts), layout)].items():
    assert _strip(specs[path]) == want, f"{path}: {specs[path]}"
  if cfg.num_experts:  # expert weights are stacked [E, D, F]; check one is really split
    gate = params["layers"][0]["mlp"]["gate_proj"]
    assert gate.addressable_shards[0].data.shape[0] == cfg.num_experts // mesh.shape["expert"]

  tokens, mask = _batch()
  step = jax.value_and_grad(_loss, has_aux=True)
  (ref_loss, ref_out), ref_grads = jax.jit(step, static_argnums=1)(
      jax.device_get(params), cfg, tokens, mask)
  batch_sharding = logical_sharding(mesh, ("activation_batch", "activation_length"), tokens.shape)
  shardings = transformer.param_shardings(cfg, mesh)
  with jax.set_mesh(mesh):
    sharded_step = jax.jit(step, static_argnums=1,
                           in_shardings=(shardings, batch_sharding, batch_sharding),
                           out_shardings=((None, None), shardings))
    (loss, out), grads = sharded_step(params, cfg, tokens, mask)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  np.testing.assert_allclose(out.logp_BxT, ref_out.logp_BxT, atol=1e-5)
  for (kp, g), r in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(g, r, atol=1e-5, err_msg=transformer.param_path(kp))
  assert grads["embed"].sharding.spec == params["embed"].sharding.spec


def test_sharded_value_forward_and_sharded_load(tmp_path):
  mesh = make_mesh(FSDP_TENSOR)
  policy = transformer.init_params(DENSE, jax.random.key(0), mesh=mesh)
  params = value.value_params_from_policy(policy, DENSE)
  params["value_head"]["kernel"] = jnp.linspace(-1.0, 1.0, DENSE.hidden_size)
  tokens, mask = _batch()
  ref = jax.jit(forward.value_forward, static_argnums=1)(jax.device_get(params), DENSE, tokens, mask)
  with jax.set_mesh(mesh):
    values = jax.jit(forward.value_forward, static_argnums=1,
                     in_shardings=(transformer.param_shardings(DENSE, mesh, "value"), None, None)
                     )(params, DENSE, tokens, mask)
  np.testing.assert_allclose(values, ref, atol=1e-5)

  params_io.save_params(tmp_path, params, DENSE, head="value")
  _, head, loaded = params_io.load_params(tmp_path, mesh=mesh)
  assert head == "value"
  assert _strip(loaded["layers"][0]["attn"]["o_proj"].sharding.spec) == ("tensor", None, "fsdp")
  np.testing.assert_array_equal(loaded["value_head"]["kernel"], params["value_head"]["kernel"])


def test_indivisible_param_is_a_clear_error():
  mesh = make_mesh(MeshConfig(fsdp=1, tensor=8))
  with pytest.raises(ValueError, match=r"param 'layers/0/attn/k_proj'.*kv_heads=4"):
    transformer.param_shardings(DENSE, mesh)
