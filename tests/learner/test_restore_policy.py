"""`sao-eval` on a run directory restores only the policy from a checkpoint that also
holds a critic and optimizer states, each param on its shards of the config's mesh."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from learner_fixtures import make_config
from sao_jax import config as C
from sao_jax.jobs.evaluate import restore_policy
from sao_jax.learner import state as state_lib
from sao_jax.models.transformer import param_shardings
from sao_jax.run.checkpoint import Checkpointer, CheckpointError
from sao_jax.sharding.mesh import make_mesh


def _record_reads(monkeypatch) -> list[str]:
  """Names of every checkpoint leaf orbax deserialises from now on."""
  reads: list[str] = []
  for handler in (ocp.type_handlers.ArrayHandler, ocp.type_handlers.NumpyHandler,
                  ocp.type_handlers.ScalarHandler):
    original = handler.deserialize

    async def recording(self, infos, args=None, *, _original=original):
      reads.extend(info.name for info in infos)
      return await _original(self, infos, args)

    monkeypatch.setattr(handler, "deserialize", recording)
  return reads


@pytest.fixture
def saved(tmp_path):
  """A critic variant's checkpoint at step 3: policy, critic, both Adam states."""
  cfg = dataclasses.replace(
      make_config("sao"), mesh=C.MeshConfig(fsdp=4, tensor=2),
      checkpoint=C.CheckpointConfig(directory=str(tmp_path / "ckpt"), async_save=False)).validate()
  state = state_lib.init_state(cfg, jax.random.key(0))
  state = state.replace(step=jnp.int32(3), policy_version=jnp.int32(2))
  assert jax.tree.leaves(state.value_params) and jax.tree.leaves(state.policy_opt_state)
  checkpointer = Checkpointer(cfg, writer=True)
  assert checkpointer.save(3, state, {"position": 3}, force=True)
  checkpointer.close()
  return cfg, state


def test_restore_policy_reads_only_the_policy_onto_the_config_mesh(saved, monkeypatch):
  cfg, state = saved
  reads = _record_reads(monkeypatch)
  mesh = make_mesh(cfg.sampler_mesh(), jax.devices())
  policy, meta = restore_policy(cfg, None, mesh)
  assert meta["step"] == 3 and meta["policy_version"] == 2
  # Only policy leaves were read: no critic, optimizer state, baseline or counter.
  assert reads and all(name.startswith("policy_params.") for name in reads), sorted(
      {name.split(".")[0] for name in reads})
  assert len(reads) == len(jax.tree.leaves(state.policy_params))
  expected = param_shardings(cfg.model, mesh, "lm")
  for got, want, sharding in zip(jax.tree.leaves(policy), jax.tree.leaves(state.policy_params),
                                 jax.tree.leaves(expected)):
    assert got.sharding == sharding and len(got.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  # Split, not replicated: q_proj [D, N, H] has D over fsdp=4 and its heads over tensor=2.
  q = policy["layers"][0]["attn"]["q_proj"]
  assert q.addressable_shards[0].data.shape == (32 // 4, 4 // 2, 8)
  # The recorder sees the other items when they are read: a full restore reads them.
  checkpointer = Checkpointer(cfg)
  checkpointer.restore(state_lib.abstract_state(cfg))
  checkpointer.close()
  assert {"value_params", "value_opt_state", "policy_opt_state"} <= {n.split(".")[0] for n in reads}


def test_restore_policy_under_lora_reads_only_the_adapters(tmp_path, monkeypatch):
  """LoRA (critic-free GRPO): the checkpoint holds adapters and their Adam state; the
  policy is the base from run.init merged with the adapters, on the mesh."""
  cfg = dataclasses.replace(
      make_config("grpo"), mesh=C.MeshConfig(fsdp=8),
      lora=C.LoraConfig(enabled=True, rank=4, alpha=8.0),
      checkpoint=C.CheckpointConfig(directory=str(tmp_path / "ckpt"), async_save=False)).validate()
  state = state_lib.init_state(cfg, jax.random.key(0))
  state = state.replace(policy_adapters=jax.tree.map(lambda x: x + 0.01, state.policy_adapters))
  checkpointer = Checkpointer(cfg, writer=True)
  assert checkpointer.save(1, state_lib.checkpointed(cfg, state), {}, force=True)
  checkpointer.close()
  reads = _record_reads(monkeypatch)
  mesh = make_mesh(cfg.sampler_mesh(), jax.devices())
  policy, _ = restore_policy(cfg, 1, mesh)
  assert reads and all(name.startswith("policy_adapters.") for name in reads), reads
  for got, want, sharding in zip(jax.tree.leaves(policy),
                                 jax.tree.leaves(state_lib.policy_weights(cfg, state)),
                                 jax.tree.leaves(param_shardings(cfg.model, mesh, "lm"))):
    assert got.sharding == sharding
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-6)


def test_restore_policy_names_a_missing_step(saved):
  cfg, _ = saved
  with pytest.raises(CheckpointError, match=r"no checkpoint of step 5 .*its steps are \[3\]"):
    restore_policy(cfg, 5, make_mesh(cfg.sampler_mesh(), jax.devices()))


def test_sao_eval_on_a_live_run_creates_deletes_and_moves_nothing(saved, capsys):
  """`sao-eval` beside a running learner: that learner is saving step 5 (orbax's temporary
  directory) and its step 4 has meta that does not read as saved. Before, the reader's
  orbax manager deleted the save in progress (cleanup_tmp_directories) and the bad meta
  raised AttributeError; now the reader skips step 4, says so, and changes no file."""
  cfg, state = saved
  directory = pathlib.Path(cfg.checkpoint.directory)
  writer = Checkpointer(cfg, writer=True)
  assert writer.save(4, state.replace(step=jnp.int32(4)), {"position": 4}, force=True)
  writer.close()
  meta_file = directory / "4" / "meta" / "metadata"
  meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "config": None}))
  saving = directory / "5.orbax-checkpoint-tmp-1234" / "state"
  saving.mkdir(parents=True)
  (saving / "partial").write_bytes(b"\x01half a step")
  before = {str(p.relative_to(directory)): None if p.is_dir() else p.read_bytes()
            for p in sorted(directory.rglob("*"))}
  policy, meta = restore_policy(cfg, None, make_mesh(cfg.sampler_mesh(), jax.devices()))
  assert meta["step"] == 3 and jax.tree.leaves(policy)
  assert before == {str(p.relative_to(directory)): None if p.is_dir() else p.read_bytes()
                    for p in sorted(directory.rglob("*"))}
  out = capsys.readouterr().out
  assert f"checkpoint {directory / '4'} does not restore (its metadata): its meta's config is " \
         "NoneType None" in out and "Skipped it (left in place" in out
