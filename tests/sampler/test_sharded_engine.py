"""`sampler.sharded`: the engine on a mesh (params by the rules, KV cache over
slots and KV heads, MoE expert parallel) samples what the one-device engine does."""

import dataclasses

import jax
import numpy as np
import pytest

from engine_fixtures import MODEL, STOP, prompts, run, with_sampler
from sao_jax.config import MeshConfig
from sao_jax.models import transformer
from sao_jax.sampler.engine import Engine
from sao_jax.sharding.mesh import make_mesh

MOE = dataclasses.replace(MODEL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                          tie_word_embeddings=False)
SAMPLER = with_sampler(slots=8)
MAX_NEW = [2, 12, 5, 11, 9, 12, 3, 7, 12, 4]


def _peaked(model, seed):
  base = transformer.init_params(model, jax.random.key(seed))
  return jax.tree.map(lambda x: x * 10.0 if x.ndim >= 2 else x, base)


def _turns(model, weights, mesh=None):
  eng = Engine(SAMPLER, model, weights, stop_token_ids=(STOP,), mesh=mesh)
  for i, prompt in enumerate(prompts(len(MAX_NEW))):
    eng.submit(i, prompt, seed=7 + i, max_new_tokens=MAX_NEW[i])
  return eng, {t.episode_id: t for t in run(eng)}


# moe_tensor: experts split Megatron style over `tensor` (expert=1), as the 30B-A3B pod
# config's sampler mesh lays them out.
@pytest.mark.parametrize("model,mesh_cfg", [
    pytest.param(MODEL, MeshConfig(fsdp=4, tensor=2), id="dense_fsdp_tensor"),
    pytest.param(MOE, MeshConfig(fsdp=2, tensor=1, expert=4), id="moe_expert_parallel"),
    pytest.param(MOE, MeshConfig(fsdp=4, tensor=2, expert=1), id="moe_tensor",
                 marks=pytest.mark.slow)])
def test_sharded_engine_samples_like_one_device(model, mesh_cfg):
  weights = _peaked(model, 0)
  _, want = _turns(model, weights)
  mesh = make_mesh(mesh_cfg)
  eng, got = _turns(model, weights, mesh)
  assert sorted(got) == sorted(want) == list(range(len(MAX_NEW)))
  for i in want:
    np.testing.assert_array_equal(got[i].tokens, want[i].tokens, err_msg=f"episode {i}")
    np.testing.assert_allclose(got[i].behavior_logp, want[i].behavior_logp, atol=1e-5,
                               err_msg=f"episode {i}")
  # A new version is laid out on the mesh too, and used from the next call on.
  newer = _peaked(model, 1)
  eng.set_params(newer, 2)
  _, want_newer = _turns(model, newer)
  for i in range(len(MAX_NEW)):
    eng.finish(i)
    eng.submit(100 + i, prompts(len(MAX_NEW))[i], seed=7 + i, max_new_tokens=MAX_NEW[i])
  got_newer = {t.episode_id - 100: t for t in run(eng)}
  for i in want_newer:
    np.testing.assert_array_equal(got_newer[i].tokens, want_newer[i].tokens)
