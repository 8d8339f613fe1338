"""LoRA in the learner: only the adapters train and hold optimizer state, step 0
scores like the base, checkpoints leave the base out and resume exactly."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner_fixtures import make_batch, make_config
from sao_jax import config as C
from sao_jax.channel import published
from sao_jax.learner import state as state_lib
from sao_jax.learner.loop import run_learner
from sao_jax.learner.step import StepConfig, train_step
from sao_jax.models import lora
from sao_jax.run.checkpoint import CheckpointError

LORA = C.LoraConfig(enabled=True, rank=4, alpha=8.0)


def lora_config(variant="grpo", **learner):
  return dataclasses.replace(make_config(variant, **learner), lora=LORA).validate()


def host(tree):
  return [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def one_step():  # compiles two train steps: the tests using it are slow-marked
  """(cfg, state before, state after, metrics) of one LoRA GRPO step, and the same
  step's metrics without LoRA."""
  batch = make_batch(1, behavior_shift=0.2)
  cfg = lora_config()
  before = state_lib.init_state(cfg, jax.random.key(0))
  after, metrics = jax.jit(functools.partial(train_step, cfg=StepConfig.of(cfg)))(
      jax.tree.map(jnp.copy, before), batch, jnp.asarray(True))
  dense_cfg = make_config("grpo")
  _, dense = jax.jit(functools.partial(train_step, cfg=StepConfig.of(dense_cfg)))(
      state_lib.init_state(dense_cfg, jax.random.key(0)), batch, jnp.asarray(True))
  return cfg, before, after, jax.tree.map(float, metrics), jax.tree.map(float, dense)


@pytest.mark.slow
def test_only_adapters_train(one_step):
  cfg, before, after, metrics, _ = one_step
  for x, y in zip(host(before.policy_params), host(after.policy_params)):
    np.testing.assert_array_equal(x, y)  # the base is frozen
  b_moved = [np.abs(ab["b"]).max() for ab in lora.flat_adapters(after.policy_adapters).values()]
  assert len(b_moved) == 14 and min(b_moved) > 0  # 7 targets x 2 layers, every B moved
  assert metrics["policy/updated"] == 1.0 and after.policy_version == 1
  # Adam's two moments over the adapters plus step counters: no state for the base.
  adapter_size = sum(x.size for x in jax.tree.leaves(after.policy_adapters))
  opt_arrays = [x for x in jax.tree.leaves(after.policy_opt_state) if x.ndim]
  assert sum(x.size for x in opt_arrays) == 2 * adapter_size


@pytest.mark.slow
def test_step_zero_scores_like_the_base(one_step):
  """B = 0: the loss (computed before the update) equals the full model's."""
  _, _, _, metrics, dense = one_step
  for name in ("policy/loss", "policy/entropy", "reward/mean"):
    np.testing.assert_allclose(metrics[name], dense[name], rtol=1e-6, err_msg=name)


@pytest.mark.slow
def test_published_and_checkpointed_trees_leave_the_base_out(one_step):
  cfg, _, after, _, _ = one_step
  assert published.published_weights(cfg, after) is after.policy_adapters
  kept = state_lib.checkpointed(cfg, after)
  assert kept.policy_params == {} and kept.value_params == {}  # grpo: no critic either
  merged = state_lib.policy_weights(cfg, after)
  assert jax.tree.structure(merged) == jax.tree.structure(after.policy_params)


def test_sft_warm_start_and_moe_mlp_targets_are_refused():
  cfg = lora_config()
  with pytest.raises(ValueError, match="run.sft_steps=5.*run.init"):
    dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, sft_steps=5)).validate()
  moe = dataclasses.replace(cfg.model, num_experts=4, moe_intermediate_size=16)
  with pytest.raises(ValueError, match="lora.targets.*MoE experts"):
    dataclasses.replace(cfg, model=moe).validate()


class Batches:
  def __init__(self):
    self.position = 0

  def __next__(self):
    self.position += 1
    return make_batch(200 + self.position, behavior_shift=0.2)

  def get_state(self):
    return {"position": self.position}

  def set_state(self, state):
    self.position = state["position"]


@pytest.mark.slow  # three learner runs, ~3 min on 2 loaded cores
def test_lora_resume_equals_uninterrupted_run(tmp_path):
  def cfg(directory, steps):
    return dataclasses.replace(
        lora_config(steps=steps), checkpoint=C.CheckpointConfig(
            directory=str(directory), save_every_steps=1, keep=2, async_save=False))

  full = run_learner(cfg(tmp_path / "full", 3), Batches())
  first = run_learner(cfg(tmp_path / "split", 2), Batches())
  assert first.steps_done == 2
  resumed = run_learner(cfg(tmp_path / "split", 3), Batches())
  assert resumed.steps_done == 3
  for x, y in zip(host(resumed.state), host(full.state)):
    np.testing.assert_array_equal(x, y)
  # A run without LoRA is told why it cannot take this checkpoint (not "damaged").
  plain = dataclasses.replace(cfg(tmp_path / "split", 3), lora=C.LoraConfig())
  with pytest.raises(CheckpointError, match="lora.enabled: checkpoint True vs config False"):
    run_learner(plain, Batches())
  assert sorted(p.name for p in (tmp_path / "split").iterdir()) == ["2", "3"]


def nbytes(tree):
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


@pytest.mark.slow  # compiles two train steps
def test_plan_counts_a_bf16_base_and_f32_adapters():
  """sao-plan compiles the real step: its argument bytes are the state's, which under
  LoRA hold the frozen base in param_dtype and float32 adapters + Adam moments only."""
  from sao_jax.learner import compile as compile_lib
  from sao_jax.planning import aot
  from sao_jax.sharding.mesh import make_mesh

  mesh = make_mesh(C.MeshConfig(data=1, fsdp=1), jax.devices()[:1])
  batch_bytes = nbytes(compile_lib.abstract_batch(make_config("grpo"), mesh, 16))
  states = {}
  for enabled in (False, True):
    cfg = make_config("grpo")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, param_dtype="bfloat16"),
                              lora=dataclasses.replace(LORA, enabled=enabled)).validate()
    state = state_lib.abstract_state(cfg)
    memory = aot.lower_train(cfg, mesh, 16).compile().memory_analysis()
    assert memory.argument_size_in_bytes == nbytes(state) + batch_bytes + 1  # + update_policy
    states[enabled] = state
  full, low_rank = states[False], states[True]
  assert {x.dtype for x in jax.tree.leaves(low_rank.policy_params)} == {jnp.dtype("bfloat16")}
  assert {x.dtype for x in jax.tree.leaves(low_rank.policy_adapters)} == {jnp.dtype("float32")}
  assert (nbytes(low_rank) - nbytes(full)
          == nbytes(low_rank.policy_adapters) + nbytes(low_rank.policy_opt_state)
          - nbytes(full.policy_opt_state))


@pytest.mark.slow  # three compiled steps on 1 and 8 devices
def test_qlora_sharded_step_equals_unsharded():
  """QLoRA (NF4 base, rows of its codes split like the kernel's input) on a 2x4 mesh
  equals one device; the NF4 base never changes."""
  from test_sharded_step import CFG, _assert_same_run, run_on

  cfg = dataclasses.replace(CFG, lora=dataclasses.replace(
      LORA, base_quantization="nf4", quant_block=16)).validate()
  reference = run_on(C.MeshConfig(fsdp=1), jax.devices()[:1], cfg=cfg)
  _assert_same_run(reference, run_on(C.MeshConfig(fsdp=2, tensor=4), jax.devices(), cfg=cfg))
  _, state, _ = reference
  q = state.policy_params["layers"][0]["attn"]["q_proj"]
  assert q["nf4_codes"].dtype == jnp.uint8
  fresh = state_lib.init_state(cfg, jax.random.key(0))
  for x, y in zip(host(fresh.policy_params), host(state.policy_params)):
    np.testing.assert_array_equal(x, y)
