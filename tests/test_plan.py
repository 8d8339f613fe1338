"""`sao-plan`: hardware table, FLOP / roofline arithmetic, the does-not-fit message, and
(slow, needs libtpu) AOT compilation for a real TPU topology."""

import dataclasses
import pathlib
import types

import jax
import pytest

from sao_jax.cli import plan as plan_cli
from sao_jax.config import (AlgorithmConfig, Config, LearnerConfig, MeshConfig, ModelConfig,
                            load_config)
from sao_jax.models.paged_blocks import KernelBlocks, KernelShapes, kernel_blocks
from sao_jax.planning import aot, estimate, hardware

GiB = 2**30
TINY_CPU = str(pathlib.Path(__file__).parents[1] / "configs" / "tiny_cpu.py")
TINY = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def test_chip_table_and_topologies():
  assert hardware.chip_spec("v5p").hbm_bytes == 95 * GiB
  assert hardware.chip_spec("v5e").hbm_bytes == 16 * GiB
  assert hardware.chip_spec("v4").hbm_bytes == hardware.chip_spec("v6e").hbm_bytes == 32 * GiB
  assert hardware.chip_spec("v5p").peak_bf16_flops == 459e12
  assert hardware.parse_topology("v5p:4x4x8") == ("v5p", (4, 4, 8))
  assert hardware.num_chips("v5p:2x2x4") == 16
  assert hardware.num_chips("v5e:2x2") == 4
  # v4 without megacore: 8 TensorCore devices on 4 chips share each chip's HBM.
  assert hardware.chip_spec("v4").per_device(chips=4, devices=8).hbm_bytes == 16 * GiB


@pytest.mark.parametrize("name, match", [("v5p-128", "expected GENERATION:AxB"),
                                         ("v9x:2x2", "TPU generation 'v9x' is unknown"),
                                         ("v5e:0x2", "every dimension must be positive")])
def test_bad_topology_names_are_explained(name, match):
  with pytest.raises(ValueError, match=match):
    hardware.parse_topology(name)


def test_memory_total_counts_donated_buffers_once():
  stats = types.SimpleNamespace(argument_size_in_bytes=10 * GiB, output_size_in_bytes=9 * GiB,
                                alias_size_in_bytes=9 * GiB, temp_size_in_bytes=3 * GiB,
                                generated_code_size_in_bytes=GiB // 2)
  assert estimate.MemoryUse.from_stats(stats).total == 13 * GiB + GiB // 2


def _cfg(variant="sao", **model):
  return Config(model=dataclasses.replace(TINY, **model),
                algorithm=AlgorithmConfig.for_variant(variant),
                learner=LearnerConfig(batch_trajectories=8, micro_batches=2))


def test_forward_flops_match_hand_count():
  t = 10
  per_layer = (2 * 16 * (4 + 2 * 2) * 8 + 2 * 4 * 8 * 16   # q, k, v, o projections
               + 2 * 4 * 8 * t                              # causal attention
               + 2 * 3 * 16 * 32)                           # SwiGLU
  f = estimate.forward_flops_per_token(TINY, t, "lm")
  assert f == {"trunk": 2 * per_layer, "attention": 2 * 2 * 4 * 8 * t, "head": 2 * 16 * 64}
  moe = dataclasses.replace(TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                            mlp_only_layers=(1,))
  moe_layer = per_layer - 2 * 3 * 16 * 32 + 2 * 3 * 16 * 8 * 2 + 2 * 16 * 4
  assert estimate.forward_flops_per_token(moe, t, "value")["trunk"] == moe_layer + per_layer


def test_step_flops_count_every_pass_and_recompute():
  t, tokens = 10, 8 * 10
  lm = estimate.forward_flops_per_token(TINY, t, "lm")
  value = estimate.forward_flops_per_token(TINY, t, "value")
  fwd_lm, fwd_value = lm["trunk"] + lm["head"], value["trunk"] + value["head"]
  # grpo: one policy forward + backward (3 forwards), no critic.
  model, hardware_flops = estimate.step_flops(_cfg("grpo"), t)
  assert model == 3 * fwd_lm * tokens
  assert hardware_flops == model + lm["head"] * tokens  # LM-head chunks recomputed
  # sao, K = 2: V_old forward + policy update + 2 value updates.
  model, _ = estimate.step_flops(_cfg("sao"), t)
  assert model == (3 * fwd_lm + fwd_value + 2 * 3 * fwd_value) * tokens
  # Full remat recomputes the trunk once per backward; blocked attention adds q k^T.
  base_model, base_hw = estimate.step_flops(_cfg("grpo"), t)
  model, hw = estimate.step_flops(_cfg("grpo", remat_policy="full", attention_impl="blocked"), t)
  assert model == base_model
  assert hw == base_hw + (lm["trunk"] + lm["attention"] / 2) * tokens


def test_roofline_arithmetic():
  r = estimate.roofline(model_flops=3e15, hardware_flops=4e15, tokens=1000, devices=10,
                        peak_flops=1e14)
  assert r.step_seconds == pytest.approx(4.0)
  assert r.mfu == pytest.approx(0.75)
  assert r.tokens_per_s == pytest.approx(250.0)
  with pytest.raises(ValueError, match="devices=0"):
    estimate.roofline(1.0, 1.0, 1, 0, 1.0)


def _memory(args_gib, temps_gib):
  return estimate.MemoryUse(arguments=int(args_gib * GiB), outputs=0, aliased=0,
                            temporaries=int(temps_gib * GiB), generated_code=0)


def test_does_not_fit_message_names_the_fix_for_activations():
  cfg = _cfg("sao")
  message = estimate.does_not_fit_message(cfg, "train_step", _memory(2, 30), 15.2 * GiB, "v5e",
                                          seq_len=4096, batch_shards=2)
  assert message.startswith("train_step does not fit: it needs 32.0 GiB per v5e device but the "
                            "limit is 15.2 GiB")
  lines = message.splitlines()[1:]
  assert lines[0] == "  - --set learner.micro_batches=4 (now 2: 4 rows per pass)"
  assert "--set model.remat_policy=full (now 'none')" in lines[1]
  assert "--set model.attention_impl=blocked" in lines[2]
  assert "--seq-len, now 4096" in lines[3]
  assert "--set mesh.fsdp" in lines[4]


def test_does_not_fit_message_puts_sharding_first_when_state_dominates():
  cfg = dataclasses.replace(_cfg("sao", remat_policy="full", attention_impl="blocked"),
                            mesh=MeshConfig(fsdp=4))
  message = estimate.does_not_fit_message(cfg, "train_step", _memory(30, 2), 15 * GiB, "v5e",
                                          seq_len=128, batch_shards=4)
  fixes = message.splitlines()[1:]
  assert fixes[0].startswith("  - --set mesh.fsdp=... larger than 4")
  assert not any("remat_policy" in f or "attention_impl" in f for f in fixes)
  # 8 / 2 = 4 trajectories per pass already equals the 4 batch shards: no micro-batch advice.
  assert not any("micro_batches" in f for f in fixes)


def test_decode_advice_names_sampler_knobs():
  message = estimate.does_not_fit_message(_cfg(), "decode_step", _memory(1, 20), 15 * GiB, "v5e",
                                          seq_len=32768, batch_shards=4)
  assert "a smaller --sampler-batch" in message
  assert "a shorter cache (--seq-len, now 32768)" in message
  # The sampler runs on its own mesh (sampler.mesh, else the learner's): the advice names
  # that knob, never the learner's mesh.
  assert "--set sampler.mesh=fsdp=1,tensor=... larger than 1" in message
  assert "--set mesh." not in message


def test_paged_decode_advice_names_the_engine_not_the_learner():
  message = estimate.compiler_oom_message(
      _cfg(), "paged_decode", "RESOURCE_EXHAUSTED: the total memory required for HLO "
      "temporaries (580.27G) exceeds available HBM (95.74G).", "v5p", 32768, 4)
  assert message.startswith("paged_decode does not fit: the TPU compiler needs 580.27 GiB")
  assert "--set sampler.kv_layout=dense" in message and "--mean-episode-tokens" in message
  assert "learner.micro_batches" not in message and "remat" not in message


def test_paged_decode_kernel_page_table_refusal_names_the_page_size():
  """The Pallas kernel's page tables sit in SMEM: 512 slots x 2048 pages of 16 tokens
  (the 8B config at 32K tokens) is 4 MiB, refused on v5p (1 MiB)."""
  message = estimate.compiler_oom_message(
      _cfg(), "paged_decode", "RESOURCE_EXHAUSTED: Allocation (size=4194304) would exceed memory "
      "(size=1048576) :: #allocation9 [shape = 'u8[4194304]{0}', space=smem, size = 0x400000, "
      "scoped, tag = 'prefetched SMEM operand 1'] :: ragged_paged_attention_kernel.36", "v5p",
      32768, 4)
  assert "ran out of memory: RESOURCE_EXHAUSTED: Allocation (size=4194304)" in message
  assert "--set sampler.kv_page_size=... larger (now 16)" in message
  assert "--set sampler.mesh=... with more chips over data x tensor (now data=1" in message


def test_sampler_advice_reads_the_sampler_mesh_not_the_learners():
  cfg = _cfg()
  cfg = dataclasses.replace(cfg, mesh=MeshConfig(fsdp=-1, tensor=2), sampler=dataclasses.replace(
      cfg.sampler, sharded=True, mesh=MeshConfig(fsdp=1, tensor=4)))
  message = estimate.compiler_oom_message(cfg, "paged_decode", "RESOURCE_EXHAUSTED: odd", "v5p",
                                          32768, 4)
  assert "fsdp=1, tensor=4; tensor a divisor of the KV heads" in message
  assert "--set sampler.mesh=... (now data=1,fsdp=1,sequence=1,tensor=4,expert=1)" in message


def test_paged_decode_figures_at_the_dense_cache_memory():
  # 64 dense rows of 32K tokens = 131072 pages of 16; 4096-token episodes take 256 pages.
  paged = estimate.paged_decode(64, 32768, 4096, 16, dense_flops=1e12, dense_bytes=76e9,
                                peak_flops=459e12, bytes_per_s=2.76e12)
  assert paged.episodes == 512
  # Same bytes as the dense step (the full pool), 8x its FLOPs: still bandwidth bound.
  assert paged.seconds == pytest.approx(76e9 / 2.76e12)
  assert paged.tokens_per_s == pytest.approx(512 * 2.76e12 / 76e9)
  compute_bound = estimate.paged_decode(64, 32768, 4096, 16, dense_flops=1e13, dense_bytes=76e9,
                                        peak_flops=459e12, bytes_per_s=2.76e12)
  assert compute_bound.seconds == pytest.approx(1e13 * 8 / 459e12)
  with pytest.raises(ValueError, match="mean episode tokens=40000 is invalid"):
    estimate.paged_decode(64, 32768, 40000, 16, 1.0, 1.0, 1.0, 1.0)


def test_plan_table_shows_paged_beside_dense():
  decode = aot.Program(name="decode_step", topology="v5p:2x2x1", mesh_shape={"fsdp": 4},
                       memory=_memory(70, 2), compiler_flops=1e12, compiler_bytes=76e9,
                       compiler_seconds=None)
  train = dataclasses.replace(decode, name="train_step")
  cfg = _cfg()
  result = aot.Plan(cfg=cfg, seq_len=32768, device=hardware.chip_spec("v5p"), devices=4,
                    hbm_fraction=0.95, train=train, decode=decode,
                    paged_decode=dataclasses.replace(decode, name="paged_decode"), sampler_batch=64,
                    mean_episode_tokens=4096, model_flops=1e15, hardware_flops=1.2e15,
                    roofline=estimate.roofline(1e15, 1.2e15, 1000, 4, 459e12),
                    kernel_blocks=(KernelBlocks(16, 32, 48 * 2**20),))
  table = aot.format_plan(result)
  assert ("paged_decode attention kernel on v5p (per device): 16 KV pages x 32 queries per "
          "block, VMEM limit 48 MiB") in table
  assert "decode step (batch 64, cache 32768)" in table
  assert ("paged decode (same KV memory, mean episode 4096 tokens, pages of 16): 512 episodes "
          "(131072 pages per shard x 1 page shards)" in table)
  assert "\npaged_decode v5p:2x2x1" in table  # its compiled memory, a row like the others


def test_plan_table_says_why_paged_decode_takes_the_reference_path():
  """No kernel traced: the table names the reference path and `Plan.attention`'s reason
  (what `paged_steps.attention_choice` gave), not a bare 'none'."""
  decode = aot.Program(name="decode_step", topology="v5p:1x2x1", mesh_shape={"tensor": 2},
                       memory=_memory(70, 2), compiler_flops=1e12, compiler_bytes=76e9,
                       compiler_seconds=None)
  why = "sampler.paged_attention='auto' on tpu, and the Pallas kernel does not take ..."
  result = aot.Plan(cfg=_cfg(), seq_len=32768, device=hardware.chip_spec("v5p"), devices=2,
                    hbm_fraction=0.95, train=None, decode=decode,
                    paged_decode=dataclasses.replace(decode, name="paged_decode"), sampler_batch=64,
                    mean_episode_tokens=4096, model_flops=1e15, hardware_flops=1.2e15,
                    roofline=estimate.roofline(1e15, 1.2e15, 1000, 2, 459e12), attention=why)
  assert f"paged_decode attention on v5p: the reference path ({why})" in aot.format_plan(result)


def test_a_multi_host_sampler_plans_the_split_pool(monkeypatch):
  """On a two-host sampler slice (v5p:2x2x2, data=2 x tensor=4) the pool of 128 dense
  rows' memory splits into 2 page shards of 8192 pages of 256 (each chip holding a
  quarter of a shard's heads): 2 x 512 episodes of 4096 tokens, the call compiled for
  1024 slots over 16384 pages, and the table says so."""
  lowered = {}
  monkeypatch.setattr(aot, "lower_train", lambda cfg, mesh, *args: "train_step")
  monkeypatch.setattr(aot, "lower_decode",
                      lambda cfg, mesh, batch, seq_len: lowered.setdefault("dense", batch))
  monkeypatch.setattr(aot, "lower_engine_decode", lambda cfg, mesh, slots, pages, seq_len:
                      lowered.setdefault("paged", (dict(mesh.shape), slots, pages)))
  monkeypatch.setattr(aot, "_compile", lambda lowered_name, *args: lowered_name)
  monkeypatch.setattr(aot, "_program", lambda name, topology, mesh, compiled: aot.Program(
      name=name, topology=topology, mesh_shape=dict(mesh.shape), memory=_memory(1, 1),
      compiler_flops=1.0, compiler_bytes=1.0, compiler_seconds=None))
  monkeypatch.setattr(hardware, "topology_devices", lambda topology: jax.devices()[
      :8 if topology == "v5p:2x2x2" else 4])
  cfg = load_config(pathlib.Path(__file__).resolve().parents[1] / "configs" / "qwen3_8b_v5p32.py")
  result = aot.plan(cfg, "v5p:2x2x4", cfg.sampler.max_seq_len, sampler_topology="v5p:2x2x2",
                    sampler_mesh=MeshConfig(data=2, fsdp=1, tensor=4), sampler_batch=128)
  assert result.page_shards == 2
  assert lowered["paged"] == ({"data": 2, "fsdp": 1, "sequence": 1, "tensor": 4, "expert": 1}, 1024, 16384)
  paged = aot.paged_decode(result)
  assert (paged.episodes, paged.shards, paged.pages_per_shard) == (1024, 2, 8192)
  table = aot.format_plan(result)
  assert "1024 episodes (8192 pages per shard x 2 page shards) vs 128 dense" in table
  # Says what runs it: one engine over two hosts is an engine group of two sao-samplers.
  assert ("note: the sampler topology v5p:2x2x2 spans 2 hosts; these figures are for one "
          "engine over all of them, run as one engine group: `sao-sampler --coordinator "
          "HOST:PORT --num-processes 2 --process-id I` on each host") in table
  # Pages that do not split evenly: the remainder is left out, episodes count per shard.
  assert estimate.paged_pool_pages(3, 32, 16, shards=4) == 4
  assert estimate.paged_episodes(3, 32, 24, 16, shards=2) == 2  # 3 pages a shard: 1 episode of 2


def test_paged_decode_compiles_at_the_claimed_concurrency_in_the_dense_memory():
  """What `plan` compiles for the paged engine, here on the CPU mesh: slots for the
  episodes the figures claim, a pool of the dense cache's pages, donated."""
  from sao_jax.sharding.mesh import make_mesh
  cfg = _small_config()
  mesh = make_mesh(MeshConfig(fsdp=-1), jax.devices()[:4])
  episodes = estimate.paged_episodes(8, 256, 64, cfg.sampler.kv_page_size)
  pages = estimate.paged_pool_pages(8, 256, cfg.sampler.kv_page_size)
  assert (episodes, pages) == (32, 128)  # 8 rows of 256 tokens = 128 pages of 16; 4 a episode
  compiled = aot.lower_engine_decode(cfg, mesh, episodes, pages, 256).compile()
  memory = estimate.MemoryUse.from_stats(compiled.memory_analysis())
  m = cfg.model  # K and V pools per layer, bf16; pages split over fsdp=4, KV heads whole
  pool = 2 * m.num_hidden_layers * pages * 16 * m.num_key_value_heads * m.head_dim * 2
  # The pool is donated in place, a quarter of it on each device.
  assert memory.arguments >= pool // 4 and pool // 4 <= memory.aliased < pool // 2


def test_compiler_out_of_memory_message():
  error = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
           "temporaries (25.17G) exceeds available HBM (15.75G).\nmore detail")
  message = estimate.compiler_oom_message(_cfg(), "train_step", error, "v5e", seq_len=16384,
                                          batch_shards=4)
  assert message.startswith("train_step does not fit: the TPU compiler needs 25.17 GiB for HLO "
                            "temporaries but a v5e device has 15.75 GiB available. To fit, try:")
  assert message.splitlines()[1].startswith("  - --set model.remat_policy=full")
  other = estimate.compiler_oom_message(_cfg(), "decode_step", "RESOURCE_EXHAUSTED: odd\nx", "v5e",
                                        seq_len=64, batch_shards=4)
  assert "the TPU compiler ran out of memory: RESOURCE_EXHAUSTED: odd. To fit" in other


def test_sampler_mesh_flag():
  assert plan_cli._mesh("data=2,tensor=4") == MeshConfig(data=2, fsdp=-1, tensor=4, expert=1)
  with pytest.raises(Exception, match="'model=2' is not AXIS=SIZE"):
    plan_cli._mesh("model=2")


def test_plan_lays_the_sampler_out_on_the_configs_sampler_mesh(monkeypatch):
  """Without --sampler-mesh the sampler's programs compile on `cfg.sampler_mesh()`
  (what a sharded sampler runs on); --sampler-mesh plans as that sampler.mesh."""
  lowered = {}

  def record(name):
    def lower(cfg, mesh, *args):
      lowered[name] = (dict(mesh.shape), cfg.sampler_mesh())
      return name
    return lower

  monkeypatch.setattr(aot, "lower_train", record("train_step"))
  monkeypatch.setattr(aot, "lower_decode", record("decode_step"))
  monkeypatch.setattr(aot, "lower_engine_decode", record("paged_decode"))
  monkeypatch.setattr(aot, "_compile", lambda lowered_name, *args: lowered_name)
  monkeypatch.setattr(aot, "_program", lambda name, topology, mesh, compiled: aot.Program(
      name=name, topology=topology, mesh_shape=dict(mesh.shape), memory=_memory(1, 1),
      compiler_flops=1.0, compiler_bytes=1.0, compiler_seconds=None))
  monkeypatch.setattr(hardware, "topology_devices", lambda topology: jax.devices()[:4])
  cfg = dataclasses.replace(_cfg(), mesh=MeshConfig(fsdp=-1))
  cfg = dataclasses.replace(cfg, sampler=dataclasses.replace(
      cfg.sampler, sharded=True, mesh=MeshConfig(fsdp=1, tensor=2, data=2)))
  aot.plan(cfg, "v5e:2x2", 64)
  assert lowered["train_step"][0] == {"data": 1, "fsdp": 4, "sequence": 1, "tensor": 1, "expert": 1}
  for name in ("decode_step", "paged_decode"):
    assert lowered[name][0] == {"data": 2, "fsdp": 1, "sequence": 1, "tensor": 2, "expert": 1}
  result = aot.plan(cfg, "v5e:2x2", 64, sampler_mesh=MeshConfig(fsdp=1, tensor=4))
  assert lowered["decode_step"] == ({"data": 1, "fsdp": 1, "sequence": 1, "tensor": 4, "expert": 1},
                                    MeshConfig(fsdp=1, tensor=4))
  assert result.cfg.sampler_mesh() == MeshConfig(fsdp=1, tensor=4)  # advice reads this


@pytest.mark.parametrize("config", ["qwen3_8b_v5p32.py", "qwen3_30b_a3b_v5p128.py"])
def test_a_paged_pod_config_plans_the_engine_it_runs(monkeypatch, config):
  """The pod configs run 512 paged slots over the memory of 64 dense rows; the plan
  compiles exactly that paged call and the dense call of those 64 rows. With the
  config's slots as the dense batch it compiled 512 dense rows of 32K tokens."""
  lowered = {}
  monkeypatch.setattr(aot, "lower_train", lambda cfg, mesh, *args: "train_step")
  monkeypatch.setattr(aot, "lower_decode",
                      lambda cfg, mesh, batch, seq_len: lowered.setdefault("dense", batch))
  monkeypatch.setattr(aot, "lower_engine_decode", lambda cfg, mesh, slots, pages, seq_len:
                      lowered.setdefault("paged", (slots, pages)))
  monkeypatch.setattr(aot, "_compile", lambda lowered_name, *args: lowered_name)
  monkeypatch.setattr(aot, "_program", lambda name, topology, mesh, compiled: aot.Program(
      name=name, topology=topology, mesh_shape=dict(mesh.shape), memory=_memory(1, 1),
      compiler_flops=1.0, compiler_bytes=1.0, compiler_seconds=None))
  monkeypatch.setattr(hardware, "topology_devices", lambda topology: jax.devices()[:4])
  cfg = load_config(pathlib.Path(__file__).resolve().parents[1] / "configs" / config)
  aot.plan(cfg, "v5p:2x2x4", cfg.sampler.max_seq_len, sampler_topology="v5p:2x2x1")
  assert (cfg.sampler.slots, cfg.sampler.num_kv_pages()) == (512, 8192)
  assert lowered == {"dense": 64, "paged": (512, 8192)}
  # The length mix the figures assume is the config's own (expected_episode_tokens).
  lowered.clear()
  longer = dataclasses.replace(cfg, sampler=dataclasses.replace(
      cfg.sampler, expected_episode_tokens=16384))
  result = aot.plan(longer, "v5p:2x2x4", 32768, sampler_topology="v5p:2x2x1")
  assert result.mean_episode_tokens == 16384 and aot.paged_decode(result).episodes == 128
  assert lowered == {"dense": 64, "paged": (512, 8192)}  # the config's slots still compile


# --- AOT compilation for a TPU topology (needs libtpu; ~1 min on 2 CPU cores) -------------

def _libtpu():
  pytest.importorskip("libtpu", reason="AOT planning for TPU needs libtpu: "
                      "pip install 'jax[tpu]==<jax version>'")


def _small_config():
  return Config(name="plan_test", mesh=MeshConfig(fsdp=-1),
                model=dataclasses.replace(TINY, attention_impl="blocked", attention_block=16,
                                          remat_policy="full", param_dtype="bfloat16",
                                          compute_dtype="bfloat16"),
                algorithm=AlgorithmConfig.for_variant("sao"),
                learner=LearnerConfig(batch_trajectories=8, micro_batches=2))


@pytest.mark.slow
@pytest.mark.tpu_compile
def test_aot_plan_small_config_fits_v5e():
  _libtpu()
  from sao_jax.planning import aot
  result = aot.plan(_small_config(), "v5e:2x2", 64)
  assert result.devices == 4
  assert result.train.mesh_shape == {"data": 1, "fsdp": 4, "sequence": 1, "tensor": 1, "expert": 1}
  for program in result.programs():
    m = program.memory
    assert m.arguments > 0 and m.generated_code > 0
    assert 0 < m.total < result.limit_bytes
  assert result.train.memory.temporaries > 0
  assert result.train.memory.aliased > 0  # the state is donated
  assert result.train.compiler_flops > 0
  aot.check_fits(result)
  table = aot.format_plan(result)
  assert "train_step   v5e:2x2" in table and "decode_step  v5e:2x2" in table
  assert "paged_decode v5e:2x2" in table  # the paged engine's call, compiled (sampler default)
  assert "MFU <=" in table


@pytest.mark.slow
@pytest.mark.tpu_compile
def test_aot_plan_oversized_config_fails_with_the_fix():
  _libtpu()
  # Dense attention over 16K tokens: [2 rows, 4 heads, 16K, 16K] float32 scores per device.
  with pytest.raises(SystemExit) as exit_info:
    plan_cli.main(["--config", TINY_CPU, "--topology", "v5e:2x2", "--seq-len", "16384",
                   "--no-decode", "--set", "learner.batch_trajectories=8"])
  message = str(exit_info.value.code)
  assert message.startswith("sao-plan: train_step does not fit: the TPU compiler needs")
  assert "--set model.attention_impl=blocked (now 'dense'" in message


@pytest.mark.slow
@pytest.mark.tpu_compile
def test_paged_steps_compile_the_pallas_kernel_for_tpu():
  """On a TPU topology "auto" prefills and decodes through the Pallas kernel (a Mosaic
  custom call, per device under shard_map over tensor), and sao-plan's paged_decode lowers it."""
  _libtpu()
  from sao_jax.models import paged
  from sao_jax.models.transformer import abstract_params, param_shardings
  from sao_jax.sampler import paged_steps
  from sao_jax.sharding.mesh import make_mesh
  small = _small_config()
  cfg = dataclasses.replace(small, mesh=MeshConfig(fsdp=2, tensor=2), model=dataclasses.replace(
      small.model, head_dim=128, num_attention_heads=4, num_key_value_heads=2))
  mesh = make_mesh(cfg.mesh, hardware.topology_devices("v5e:2x2"))
  assert paged_steps.attention_path(cfg.sampler, cfg.model, mesh) == "pallas"
  compiled = aot.lower_engine_decode(cfg, mesh, slots=8, pages=64, max_len=64).compile()
  assert "ragged_paged_attention_kernel" in compiled.as_text()
  assert estimate.MemoryUse.from_stats(compiled.memory_analysis()).aliased > 0  # pool donated

  # The batched prefill: 4 rows of 32-token chunks into 8 slots of 64 tokens.
  params = aot._abstract(abstract_params(cfg.model, "lm"), param_shardings(cfg.model, mesh, "lm"))
  cache = jax.eval_shape(lambda: paged.init_paged_cache(cfg.model, 64, cfg.sampler.kv_page_size, 8))
  cache = aot._abstract(cache, paged_steps.cache_shardings(cache, mesh))
  host = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  arg = lambda *shape, dtype=jax.numpy.int32: jax.ShapeDtypeStruct(shape, dtype, sharding=host)
  prefill = paged_steps.compile_steps(cfg.model, cfg.sampler, (), mesh).prefill
  compiled = prefill.lower(params, cache, arg(8, 64 // cfg.sampler.kv_page_size), arg(4),
                           arg(4, 32), arg(4, 32), arg(4), arg(4, dtype=jax.numpy.uint32)).compile()
  assert "ragged_paged_attention_kernel" in compiled.as_text()
  assert estimate.MemoryUse.from_stats(compiled.memory_analysis()).aliased > 0  # pool donated


@pytest.mark.slow
@pytest.mark.tpu_compile
def test_plan_compiles_and_prints_the_kernel_sizes_a_tpu_run_uses():
  """sao-plan runs on a CPU backend; the paged decode call it compiles holds the kernel
  with the block sizes of the topology's generation at the per-device shapes (what a
  sampler on those chips computes), not the off-TPU ones, and the table prints them."""
  _libtpu()
  small = _small_config()
  cfg = dataclasses.replace(
      small, model=dataclasses.replace(small.model, head_dim=128, num_attention_heads=4,
                                       num_key_value_heads=2),
      sampler=dataclasses.replace(small.sampler, sharded=True,
                                  mesh=MeshConfig(data=1, fsdp=2, tensor=2)))
  result = aot.plan(cfg, "v5e:2x2", 64)
  page = cfg.sampler.kv_page_size
  # Slots and pages split over fsdp=2 (page shards): each device's kernel takes half.
  slots = max(estimate.paged_episodes(result.sampler_batch, 64, result.mean_episode_tokens, page,
                                      shards=2), -(-cfg.sampler.slots // 2) * 2)
  per_device = KernelShapes(page_size=page, pages_per_seq=64 // page, num_q_tokens=slots // 2,
                            num_q_heads=2, num_kv_heads=1, head_dim=128,
                            q_dtype=jax.numpy.bfloat16, kv_dtype=jax.numpy.bfloat16)
  run = kernel_blocks("v5e", per_device)
  assert result.kernel_blocks == (run,)
  assert run != kernel_blocks(None, per_device)  # the off-TPU sizes it compiled before
  assert f"paged_decode attention kernel on v5e (per device): {run.describe()}" in \
      aot.format_plan(result)


@pytest.mark.slow
@pytest.mark.tpu_compile
def test_the_split_pool_compiles_and_fits_on_a_two_host_sampler_slice():
  """#39's plan, compiled for real (sampler programs only, --no-train: 56 s alone, 15 min
  beside other compiles):
  the 8B pod config's engine on a two-host v5p:2x2x2 sampler slice with data 2 x tensor
  4, over the memory of 128 dense rows of 32K tokens, holds 2 page shards of 8,192
  pages of 256: 1,024 episodes of 4,096 tokens, and the call at that many slots fits.
  Measured with libtpu 0.0.42.1: paged_decode 77.99 GiB of 95 per chip."""
  _libtpu()
  cfg = load_config(pathlib.Path(__file__).resolve().parents[1] / "configs" / "qwen3_8b_v5p32.py")
  result = aot.plan(cfg, "v5p:2x2x4", cfg.sampler.max_seq_len, sampler_topology="v5p:2x2x2",
                    sampler_mesh=MeshConfig(data=2, fsdp=1, tensor=4), sampler_batch=128,
                    with_train=False)
  aot.check_fits(result)
  paged = aot.paged_decode(result)
  assert (paged.episodes, paged.shards, paged.pages_per_shard) == (1024, 2, 8192)
  assert result.paged_decode.mesh_shape == {"data": 2, "fsdp": 1, "sequence": 1, "tensor": 4, "expert": 1}
  assert result.paged_decode.memory.total / estimate.GiB == pytest.approx(77.99, abs=0.01)
