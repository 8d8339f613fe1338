"""Ready single-host layouts (`sao_jax.config.hosts`), config files with an argument
(`configs/x.py:v6e-8`), and what sao-plan compiles for a host config
(`aot.host_targets`, GPU rating, one shared GPU)."""

import dataclasses
import pathlib

import jax
import pytest

from sao_jax.cli import plan as plan_cli
from sao_jax.config import MeshConfig, apply_overrides, hosts, load_config
from sao_jax.models.paged_blocks import KernelBlocks
from sao_jax.planning import aot, estimate, hardware
from tiny_run import TINY_RUN

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
GIB = 2**30


def test_a_host_config_gets_the_hosts_split_and_meshes():
  cfg = load_config(f"{CONFIGS / 'qwen3_4b.py'}:v6e-8")
  assert cfg.run.host == "v6e-8"
  assert (cfg.run.num_samplers, cfg.run.device_split) == (1, (4, 4))
  assert cfg.mesh == MeshConfig(data=1, fsdp=-1, tensor=1, expert=1)
  # Tensor over whatever a sampler process opens: its 4 chips in the run, the whole host
  # under sao-eval (a fixed tensor=4 would not lay out over sao-eval's 8).
  assert cfg.sampler.sharded and cfg.sampler.mesh == MeshConfig(data=1, fsdp=1, tensor=-1)
  assert cfg.sampler.mesh.shape(4)["tensor"] == 4 and cfg.sampler.mesh.shape(8)["tensor"] == 8
  assert cfg.model.num_hidden_layers == 36  # the file's own model, not the base's
  one_gpu = load_config(f"{CONFIGS / 'qwen3_0_6b.py'}:h100-1")
  assert one_gpu.run.device_split == () and not one_gpu.sampler.sharded
  assert one_gpu.sampler.mesh is None
  plain = load_config(CONFIGS / "qwen3_4b.py")  # no argument: no host, as before
  assert plain.run.host == "" and plain.run.device_split == ()


@pytest.mark.parametrize("name, learner, sampler", [
    ("v6e-8", "v6e:1x4", "v6e:1x4"), ("v5p-8", "v5p:1x2x1", "v5p:1x2x1"),
    ("h100-8", "v5p:2x2x1", "v5p:2x2x1"), ("h100-1", "v5p:1x1x1", "v5p:1x1x1")])
def test_each_process_is_planned_on_the_chips_it_opens(name, learner, sampler):
  """A split TPU process opens chips [start, start + n) under bounds 1,n,1
  (`sao_jax.sharding.device_split.tpu_plan`): GEN:1xn; GPU processes: their proxy."""
  targets = aot.host_targets(load_config(f"{CONFIGS / 'qwen3_0_6b.py'}:{name}"))
  assert (targets.topology, targets.sampler_topology) == (learner, sampler)
  assert targets.rate_as == ("h100" if name.startswith("h100") else None)
  assert targets.shared_device == (name == "h100-1")


def test_a_whole_tpu_host_keeps_its_own_shape():
  spec = hosts.host("v6e-8")
  assert hosts.process_topology(spec, 8) == "v6e:2x4"
  assert hosts.process_topology(spec, 2) == "v6e:1x2"
  cfg = load_config(f"{CONFIGS / 'qwen3_0_6b.py'}:v6e-8", ["run.device_split=[6,2]"])
  assert aot.host_targets(cfg).topology == "v6e:1x6"  # the split the run makes, not the host's


def test_bad_hosts_and_arguments_are_refused_naming_the_fix():
  with pytest.raises(ValueError, match="host 'v9-8' is unknown: ready layouts are v6e-8, v5p-8"):
    load_config(f"{CONFIGS / 'qwen3_0_6b.py'}:v9-8")
  with pytest.raises(ValueError, match=r"run.host='tpu' is invalid: expected a ready layout"):
    load_config(CONFIGS / "qwen3_0_6b.py", ["run.host=tpu"])
  with pytest.raises(ValueError, match=r"run.host='v6e-8' has 8 devices: give out exactly"):
    load_config(f"{CONFIGS / 'qwen3_0_6b.py'}:v6e-8", ["run.device_split=[4,2]"])
  with pytest.raises(ValueError, match=r"passes 'v6e-8' to get_config\(\), which takes no "
                     "argument"):
    load_config(f"{CONFIGS / 'demo_cpu.py'}:v6e-8")
  with pytest.raises(ValueError, match="ends in ':' with no argument"):
    load_config(f"{CONFIGS / 'qwen3_0_6b.py'}:")
  with pytest.raises(ValueError, match="names no run.host: pass --topology"):
    aot.host_targets(load_config(CONFIGS / "qwen3_0_6b.py"))


def _program(name, total_gib, topology="v5p:1x1x1"):
  memory = estimate.MemoryUse(arguments=int(total_gib * GIB), outputs=0, aliased=0,
                              temporaries=0, generated_code=0)
  return aot.Program(name=name, topology=topology, mesh_shape={"fsdp": 1}, memory=memory,
                     compiler_flops=1.0, compiler_bytes=1.0, compiler_seconds=None)


def _plan(train_gib, decode_gib, shared):
  cfg = load_config(f"{CONFIGS / 'qwen3_0_6b.py'}:h100-1")
  gpu = hardware.GPUS["h100"]
  return aot.Plan(cfg=cfg, seq_len=4096, device=gpu, devices=1, hbm_fraction=0.95,
                  train=_program("train_step", train_gib),
                  decode=_program("decode_step", decode_gib),
                  paged_decode=_program("paged_decode", decode_gib + 1), sampler_batch=32,
                  mean_episode_tokens=512, model_flops=1e15, hardware_flops=1e15,
                  roofline=estimate.roofline(1e15, 1e15, 1000, 1, gpu.peak_bf16_flops),
                  rated_as="h100", shared_device=shared)


def test_one_shared_gpu_must_hold_the_learner_and_the_sampler_together():
  """h100-1: each program fits the 75.67 GiB limit (95% of 79.65 GiB) alone, but the
  learner's 50 GiB and the sampler's largest program (paged, 31 GiB) together do not."""
  aot.check_fits(_plan(50, 30, shared=False))
  with pytest.raises(aot.DoesNotFit, match=r"share each device, and together they need 81.00 GiB "
                     r"of the 75.67 GiB limit on h100"):
    aot.check_fits(_plan(50, 30, shared=True))
  aot.check_fits(_plan(40, 30, shared=True))
  table = aot.format_plan(_plan(40, 30, shared=True))
  assert "ESTIMATE for h100: compiled by the TPU compiler for v5p:1x1x1" in table
  assert "learner and sampler share each device: 71.00 GiB together" in table
  # The proxy compiled the TPU kernel, which the GPU does not run; with no kernel
  # blocks recorded the proxy took the reference path too, and the line says so.
  kernel = dataclasses.replace(_plan(40, 30, shared=True),
                               kernel_blocks=(KernelBlocks(4, 8, None),))
  assert ("paged_decode attention kernel of the TPU proxy (per device): 4 KV pages x 8 "
          "queries per block, no VMEM limit; on h100 the engine runs the reference attention "
          "path instead") in aot.format_plan(kernel)
  assert "paged_decode attention on h100: the reference path" in table


def test_sao_plan_takes_the_hosts_targets_from_the_config(monkeypatch, capsys):
  seen = {}

  def plan(cfg, topology, seq_len, **kwargs):
    seen.update(topology=topology, **kwargs)
    raise SystemExit(0)

  monkeypatch.setattr(aot, "plan", plan)
  with pytest.raises(SystemExit):
    plan_cli.run(plan_cli.build_parser().parse_args(
        ["--config", f"{CONFIGS / 'llama3_2_3b.py'}:h100-8"]))
  assert seen["topology"] == "v5p:2x2x1" and seen["sampler_topology"] == "v5p:2x2x1"
  assert seen["rate_as"] == "h100" and not seen["shared_device"]
  assert "run.host=h100-8: learner on v5p:2x2x1, sampler on v5p:2x2x1, rated as h100" in \
      capsys.readouterr().out


def test_a_gpu_rating_replaces_the_tpu_chip(monkeypatch):
  monkeypatch.setattr(aot, "lower_train", lambda cfg, mesh, *args: "train_step")
  monkeypatch.setattr(aot, "_compile", lambda lowered, *args: lowered)
  monkeypatch.setattr(aot, "_program", lambda name, topology, mesh, compiled: _program(name, 1))
  monkeypatch.setattr(hardware, "topology_devices", lambda topology: jax.devices()[:4])
  cfg = load_config(f"{CONFIGS / 'qwen3_0_6b.py'}:h100-8")
  result = aot.plan(cfg, "v5p:2x2x1", 4096, with_decode=False, rate_as="h100")
  assert result.device == hardware.GPUS["h100"] and result.rated_as == "h100"
  assert result.roofline.step_seconds == pytest.approx(result.hardware_flops / (4 * 989e12))
  with pytest.raises(ValueError, match="rate_as='a100' is unknown: known GPUs are h100"):
    aot.plan(cfg, "v5p:2x2x1", 4096, with_decode=False, rate_as="a100")


@pytest.mark.slow
def test_a_host_layout_trains_end_to_end_on_the_emulated_devices(tmp_path):
  """The v6e-8 layout on the 8 emulated CPU devices: the learner on devices 0-3 (fsdp 4),
  one sampler process on its own 4 (a tensor-4 engine), two SAO steps through it."""
  from sao_jax.jobs import train

  cfg = hosts.on_host(load_config(CONFIGS / "demo_cpu.py"), "v6e-8")
  cfg = apply_overrides(cfg, TINY_RUN + ["model.num_key_value_heads=4", "learner.steps=2",
                                         f"run.run_dir={tmp_path / 'run'}", "run.eval_every=0",
                                         "run.loggers="]).validate()
  learner_devices, sampler_envs = train.local_devices(cfg)
  assert [d.id for d in learner_devices] == [0, 1, 2, 3]
  assert sampler_envs == [{"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"}]
  summary = train.run(cfg, log=print)
  assert summary["steps_done"] == 2


def test_a_sampler_slice_plans_without_the_train_step(monkeypatch):
  """--no-train: the sampler's programs alone (nothing lowers the train step), the train
  figures only analytic; planning nothing, or a shared device without its learner, is
  refused."""
  lowered = []
  monkeypatch.setattr(aot, "lower_train", lambda *args: lowered.append("train_step"))
  monkeypatch.setattr(aot, "lower_decode", lambda *args: lowered.append("decode_step") or "d")
  monkeypatch.setattr(aot, "lower_engine_decode",
                      lambda *args: lowered.append("paged_decode") or "p")
  monkeypatch.setattr(aot, "_compile", lambda lowered_name, *args: lowered_name)
  monkeypatch.setattr(aot, "_program", lambda name, topology, mesh, compiled: _program(name, 1))
  monkeypatch.setattr(hardware, "topology_devices", lambda topology: jax.devices()[:4])
  cfg = load_config(f"{CONFIGS / 'qwen3_0_6b.py'}:v6e-8")
  result = aot.plan(cfg, "v6e:1x4", 4096, with_train=False)
  assert lowered == ["decode_step", "paged_decode"] and result.train is None
  assert [p.name for p in result.programs()] == ["decode_step", "paged_decode"]
  aot.check_fits(result)
  assert "train step not compiled (--no-train)" in aot.format_plan(result)
  with pytest.raises(ValueError, match="nothing to plan"):
    aot.plan(cfg, "v6e:1x4", 4096, with_train=False, with_decode=False)
  with pytest.raises(ValueError, match="shared_device adds the learner's and the sampler's"):
    aot.plan(cfg, "v6e:1x4", 4096, with_train=False, shared_device=True)
