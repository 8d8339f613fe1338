"""Ahead-of-time compilation of the learner and sampler programs for a TPU topology.

  plan(cfg, topology, seq_len, ...)  -> Plan   (compiles; allocates no params)
  check_fits(plan)                   -> raises DoesNotFit naming what to change
  format_plan(plan)                  -> the printed table

The train step is `sao_jax.learner.compile.compile_train_step` (the learner's own
jit, shardings and donation) lowered on `jax.ShapeDtypeStruct`s that carry the
state's and batch's shardings over a mesh of compile-only TPU devices from
`jax.experimental.topologies`; the decode step is `sao_jax.models.decode.
decode_step` on an abstract KV cache for the sampler's slice. With the paged
engine (`sampler.kv_layout="paged"`), its own decode call
(`sao_jax.sampler.paged_steps.decode`, `sampler.steps_per_call` steps, built
through the KV-layout seam `sao_jax.sampler.kv_layout` as the engine builds it) is
compiled too, at the concurrency the paged figures claim: as many slots as
episodes of the assumed mean length fit in the dense cache's memory, over a
pool of exactly that memory, so the claim is checked by the compiler rather
than only estimated. On a sampler mesh with data (or fsdp) axes the pool is
split into that many page shards (`sao_jax.models.paged_mesh`), each chip
holding pool / (data x fsdp x tensor): the figures count episodes per shard
(pages per shard over pages per episode) times the shards, as the engine
admits them, e.g. a two-host v5p:2x2x2 sampler slice with data=2, tensor=4.
The Pallas kernel's block sizes in that call are the ones a TPU of the
topology's generation runs (`sao_jax.models.paged_blocks`): the plan traces on
the topology's devices, records them (`Plan.kernel_blocks`) and prints them, or,
where `sampler.paged_attention` takes the reference path, why (`Plan.attention`:
e.g. "auto" for a model whose per-device attention libtpu cannot compile the
kernel for, `sao_jax.sampler.paged_steps.attention_choice`). Likewise the train
step's attention under `model.attention_impl` "splash" or "auto" is the path the
learner takes on the topology's devices (`Plan.learner_attention`: the splash
kernel and its blocks, or the blocked path and why, `sao_jax.models.splash.choose`),
and the train FLOPs count that path's backward recompute.
Nothing is ever allocated, so a 30B-parameter plan runs on a laptop CPU once
libtpu is installed.

A config made for a ready host (`run.host`, `sao_jax.config.hosts`) is planned on
that host's processes (`host_targets`): the learner's program for the chips the
learner opens, the sampler's for the sampler's; a GPU host's programs compile for
its TPU proxy and are rated as its GPU (`rate_as`: HBM limit, peak, bandwidth),
and on one shared GPU (`shared_device`) the learner's and the sampler's programs
must fit in it together.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from sao_jax.config import Config, MeshConfig, hosts
from sao_jax.learner import compile as compile_lib
from sao_jax.learner import state as state_lib
from sao_jax.models import decode
from sao_jax.models.paged_blocks import KernelBlocks
from sao_jax.models.paged_kernel import record_blocks
from sao_jax.models.paged_mesh import page_shards
from sao_jax.models.transformer import abstract_params, param_shardings
from sao_jax.planning import estimate, hardware
from sao_jax.sampler import paged_steps
from sao_jax.sampler import steps as sampler_steps
from sao_jax.sampler.kv_layout import kv_layout
from sao_jax.sharding.mesh import make_mesh, traced_on
from sao_jax.sharding.rules import RULES, logical_to_spec


class DoesNotFit(ValueError):
  """A program needs more memory per device than the chip's HBM allows."""


@dataclasses.dataclass(frozen=True)
class Program:
  """One compiled program: per-device memory, XLA's cost estimate (loop bodies counted once)."""

  name: str
  topology: str
  mesh_shape: dict[str, int]
  memory: estimate.MemoryUse
  compiler_flops: float
  compiler_bytes: float
  compiler_seconds: float | None  # XLA's optimal_seconds; None where it reports none


@dataclasses.dataclass(frozen=True)
class Plan:
  cfg: Config
  seq_len: int
  device: hardware.Chip  # per-device share of the chip
  devices: int
  hbm_fraction: float  # usable share of HBM
  train: Program | None  # None: the sampler's programs alone (`plan(with_train=False)`)
  decode: Program | None
  paged_decode: Program | None  # the paged engine's decode call at `paged_decode(plan).episodes`
  sampler_batch: int
  mean_episode_tokens: int  # the assumed length distribution's mean, for the paged figures
  model_flops: float
  hardware_flops: float
  roofline: estimate.Roofline
  kernel_blocks: tuple[KernelBlocks, ...] = ()  # the Pallas kernel's sizes in paged_decode
  attention: str = ""  # why paged_decode attends as it does (`paged_steps.attention_choice`)
  # The train step's attention path and why (`compile.learner_attention`; "" for
  # model.attention_impl "dense" or "blocked").
  learner_attention: str = ""
  page_shards: int = 1  # the paged pool's shards on the sampler mesh (its data x fsdp)
  rated_as: str = ""  # a GPU whose figures rate programs compiled for a TPU proxy
  shared_device: bool = False  # learner and sampler on the same device(s): memory adds

  @property
  def limit_bytes(self) -> float:
    return self.device.hbm_bytes * self.hbm_fraction

  def programs(self) -> list[Program]:
    return [p for p in (self.train, self.decode, self.paged_decode) if p is not None]


def _abstract(tree, shardings):
  return jax.tree.map(lambda leaf, sh: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sh),
                      tree, shardings)


def _cost(compiled) -> tuple[float, float, float | None]:
  """(flops, bytes accessed, optimal_seconds) per device; XLA reports -1 s when it has none."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  seconds = cost.get("optimal_seconds")
  return (float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)),
          float(seconds) if seconds is not None and seconds > 0 else None)


def _program(name: str, topology: str, mesh: jax.sharding.Mesh, compiled) -> Program:
  flops, bytes_accessed, seconds = _cost(compiled)
  return Program(name=name, topology=topology, mesh_shape=dict(mesh.shape),
                 memory=estimate.MemoryUse.from_stats(compiled.memory_analysis()),
                 compiler_flops=flops, compiler_bytes=bytes_accessed, compiler_seconds=seconds)


def _compile(lowered, cfg: Config, name: str, mesh: jax.sharding.Mesh, chip: str, seq_len: int):
  """`lowered.compile()`, turning the TPU compiler's out-of-HBM error into DoesNotFit."""
  try:
    return lowered.compile()
  except jax.errors.JaxRuntimeError as error:
    if "RESOURCE_EXHAUSTED" not in str(error):
      raise
    raise DoesNotFit(estimate.compiler_oom_message(
        cfg, name, str(error), chip, seq_len, batch_shards(dict(mesh.shape)))) from error


def lower_train(cfg: Config, mesh: jax.sharding.Mesh, seq_len: int):
  """The learner's jitted train step, lowered for abstract state and batch."""
  state = _abstract(state_lib.abstract_state(cfg), compile_lib.state_shardings(cfg, mesh))
  batch = compile_lib.abstract_batch(cfg, mesh, seq_len)
  update_policy = jax.ShapeDtypeStruct((), jnp.bool_, sharding=NamedSharding(mesh, PartitionSpec()))
  step = compile_lib.compile_train_step(cfg, mesh, seq_len)
  return step.lower(state, batch, update_policy)


def lower_decode(cfg: Config, mesh: jax.sharding.Mesh, batch: int, max_len: int):
  """One sampler decode step (`decode.decode_step`) on a cache of `max_len` slots."""
  model = cfg.model
  # The policy a sampler runs (under LoRA the merged one, not the learner's base).
  params = _abstract(abstract_params(model, "lm"), param_shardings(model, mesh, "lm"))
  cache_shapes = jax.eval_shape(functools.partial(decode.init_cache, model, batch, max_len))
  cache_sh = sampler_steps.cache_shardings(cache_shapes, mesh)
  cache = _abstract(cache_shapes, cache_sh)
  tokens_sh = NamedSharding(mesh, logical_to_spec(("activation_batch",), (batch,), dict(mesh.shape),
                                                  strict=False))
  tokens = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=tokens_sh)
  # Traced on the mesh like the sampler's programs (MoE layers expert parallel).
  step = jax.jit(traced_on(mesh, lambda p, c, t: decode.decode_step(p, model, c, t)),
                 out_shardings=(NamedSharding(mesh, PartitionSpec()), cache_sh), donate_argnums=1)
  return step.lower(params, cache, tokens)


def lower_engine_decode(cfg: Config, mesh: jax.sharding.Mesh, slots: int, pages: int,
                        max_len: int):
  """The sampler engine's own decode call (`sampler.steps_per_call` steps over `slots`
  slots of `max_len` tokens; for the paged layout over a pool of `pages` pages, every
  page listed), lowered on abstract params and cache through the KV-layout seam
  (`sao_jax.sampler.kv_layout`): the programs, cache and shardings the engine builds."""
  sampler = dataclasses.replace(cfg.sampler, slots=slots, kv_pages=pages, max_seq_len=max_len)
  layout = kv_layout(sampler)
  params = _abstract(abstract_params(cfg.model, "lm"), param_shardings(cfg.model, mesh, "lm"))
  cache = layout.abstract_cache(cfg.model, sampler, mesh)
  args, static = layout.programs.abstract_decode_args(sampler, mesh)
  step = layout.programs.compile_steps(cfg.model, sampler, (), mesh).decode
  return step.lower(params, cache, *args, **static)


@dataclasses.dataclass(frozen=True)
class Targets:
  """Where `plan` compiles a config made for a ready host (`host_targets`)."""

  topology: str
  sampler_topology: str
  rate_as: str | None
  shared_device: bool


def host_targets(cfg: Config) -> Targets:
  """The compile targets of `cfg.run.host` under the config's own `run.device_split`
  (`hosts.process_topology`); ValueError when the config names no host."""
  if not cfg.run.host:
    raise ValueError("the config names no run.host: pass --topology (and --sampler-topology), "
                     f"or use a config made for a host ({', '.join(hosts.HOSTS)})")
  spec = hosts.host(cfg.run.host)
  split = cfg.run.device_split
  learner, sampler = (split[0], split[1]) if split else (spec.devices, spec.devices)
  return Targets(topology=hosts.process_topology(spec, learner),
                 sampler_topology=hosts.process_topology(spec, sampler),
                 rate_as=spec.chip if spec.platform == "gpu" else None,
                 shared_device=not split)


def batch_shards(mesh_shape: dict[str, int]) -> int:
  """Devices a batch dimension splits over (the activation-batch mesh axes)."""
  count = 1
  for axis in RULES["activation_batch"]:
    count *= mesh_shape.get(axis, 1)
  return count


def dense_rows(cfg: Config, seq_len: int) -> int:
  """The dense decode plan's batch: the seq_len-token rows the engine's KV memory holds
  (`programs.cache_rows`: `sampler.slots`, or for a paged engine with its own pool
  size the rows of that pool), so the dense figures and the paged engine's compare
  at one KV memory."""
  return kv_layout(cfg.sampler).programs.cache_rows(cfg.sampler, seq_len)


def plan(cfg: Config, topology: str, seq_len: int, *, sampler_topology: str | None = None,
         sampler_mesh: MeshConfig | None = None, sampler_batch: int | None = None,
         hbm_fraction: float = 0.95, with_decode: bool = True,
         mean_episode_tokens: int | None = None, rate_as: str | None = None,
         shared_device: bool = False, with_train: bool = True) -> Plan:
  """Compiles the train step (and the sampler's decode step) and estimates throughput.

  The sampler's programs run on `sampler_mesh` (default `cfg.sampler_mesh()`, the
  mesh a sharded sampler uses) over `sampler_topology` (default `topology`).
  `mean_episode_tokens` (default `sampler.expected_episode_tokens`, else seq_len //
  8: a long-tailed mix) is the assumed mean episode length for the paged engine's
  figures (`paged_decode`). `rate_as` names a GPU (`hardware.GPUS`) whose memory
  and speed rate the programs compiled for `topology` (an estimate); with
  `shared_device` the sampler runs on the learner's devices and `check_fits` adds
  their memory. `with_train=False` compiles the sampler's programs alone (a sampler
  slice planned apart from its learner); the train figures are then only the
  analytic FLOPs and roofline."""
  if seq_len < 2:
    raise ValueError(f"seq_len={seq_len} is invalid: a trajectory needs at least 2 tokens")
  if not 0.0 < hbm_fraction <= 1.0:
    raise ValueError(f"hbm_fraction={hbm_fraction} is invalid: expected 0 < fraction <= 1")
  if not (with_train or with_decode):
    raise ValueError("nothing to plan: with_train=False and with_decode=False")
  if shared_device and not (with_train and with_decode):
    raise ValueError("shared_device adds the learner's and the sampler's memory: plan both")
  if sampler_mesh is not None:  # planned as the config's sampler.mesh (advice names it)
    cfg = dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, mesh=sampler_mesh))
  generation, _ = hardware.parse_topology(topology)
  devices = hardware.topology_devices(topology)
  device = hardware.chip_spec(generation).per_device(hardware.num_chips(topology), len(devices))
  if rate_as is not None:
    if rate_as not in hardware.GPUS:
      raise ValueError(f"rate_as={rate_as!r} is unknown: known GPUs are {', '.join(hardware.GPUS)}")
    device = hardware.GPUS[rate_as]
  train = None
  learner_attention = None
  if with_train:
    mesh = make_mesh(cfg.mesh, devices)
    learner_attention = compile_lib.learner_attention(cfg, mesh, seq_len)
    train = _program("train_step", topology, mesh, _compile(
        lower_train(cfg, mesh, seq_len), cfg, "train_step", mesh, device.name, seq_len))
  sampler_batch = sampler_batch or dense_rows(cfg, seq_len)
  mean_episode_tokens = (mean_episode_tokens or cfg.sampler.expected_episode_tokens
                         or max(seq_len // 8, 1))
  decode_program = paged_program = None
  kernel_blocks: list[KernelBlocks] = []
  attention = ""
  shards = 1
  if with_decode:
    sampler_topology = sampler_topology or topology
    if hardware.parse_topology(sampler_topology)[0] != generation:
      raise ValueError(f"sampler topology {sampler_topology!r} must use the learner's TPU "
                       f"generation {generation!r} (one HBM limit per plan)")
    sampler_devices = hardware.topology_devices(sampler_topology)
    sampler = make_mesh(cfg.sampler_mesh(), sampler_devices)
    shards = page_shards(dict(sampler.shape))
    decode_program = _program("decode_step", sampler_topology, sampler, _compile(
        lower_decode(cfg, sampler, sampler_batch, seq_len), cfg, "decode_step", sampler,
        device.name, seq_len))
    plan_program = kv_layout(cfg.sampler).plan_program
    if plan_program is not None:  # the engine's own decode call, beside the dense step
      page = cfg.sampler.kv_page_size
      # Compiled for the episodes the figures claim, or the config's own slots when it
      # runs more (a multiple of the page shards, as the engine needs): the call that
      # runs must fit too.
      episodes = max(estimate.paged_episodes(sampler_batch, seq_len, mean_episode_tokens, page,
                                             shards), -(-cfg.sampler.slots // shards) * shards)
      pages = estimate.paged_pool_pages(sampler_batch, seq_len, page, shards)
      attention = paged_steps.attention_choice(cfg.sampler, cfg.model, sampler)[1]
      with record_blocks() as kernel_blocks:
        lowered = lower_engine_decode(cfg, sampler, episodes, pages, seq_len)
      paged_program = _program(plan_program, sampler_topology, sampler, _compile(
          lowered, cfg, plan_program, sampler, device.name, seq_len))
  model_flops, hardware_flops = estimate.step_flops(
      cfg, seq_len, learner_attention.impl if learner_attention else None)
  tokens = cfg.learner.batch_rows * seq_len  # token slots: packed rows count whole
  return Plan(cfg=cfg, seq_len=seq_len, device=device, devices=len(devices),
              hbm_fraction=hbm_fraction, train=train, decode=decode_program,
              paged_decode=paged_program, sampler_batch=sampler_batch,
              mean_episode_tokens=mean_episode_tokens, model_flops=model_flops,
              hardware_flops=hardware_flops,
              roofline=estimate.roofline(model_flops, hardware_flops, tokens, len(devices),
                                         device.peak_bf16_flops),
              kernel_blocks=tuple(dict.fromkeys(kernel_blocks)), attention=attention,
              learner_attention=learner_attention.describe() if learner_attention else "",
              page_shards=shards,
              rated_as=rate_as or "", shared_device=shared_device)


def check_fits(result: Plan) -> None:
  """Raises DoesNotFit for the first program over the HBM limit, naming what to change;
  on a shared device, also when the learner's and the sampler's programs together are."""
  for program in result.programs():
    if program.memory.total > result.limit_bytes:
      raise DoesNotFit(estimate.does_not_fit_message(
          result.cfg, program.name, program.memory, result.limit_bytes, result.device.name,
          result.seq_len, batch_shards(program.mesh_shape)))
  if result.shared_device and shared_total(result) > result.limit_bytes:
    need, limit = shared_total(result) / estimate.GiB, result.limit_bytes / estimate.GiB
    raise DoesNotFit(
        f"the learner and the sampler share each device, and together they need "
        f"{need:.2f} GiB of the {limit:.2f} GiB limit on {result.device.name}: make one of them "
        "smaller (learner.micro_batches, sampler.slots or sampler.kv_pages), or give them "
        "devices of their own (run.device_split)")


def shared_total(result: Plan) -> int:
  """Bytes per device when the learner's train step and the sampler's largest decode
  program are resident at once (one shared device)."""
  sampler = [p.memory.total for p in (result.decode, result.paged_decode) if p is not None]
  return result.train.memory.total + max(sampler, default=0)


def decode_seconds(result: Plan) -> float:
  """Roofline time of one decode step (no loops inside, so XLA's costs are whole-step)."""
  d, device = result.decode, result.device
  return max(d.compiler_flops / device.peak_bf16_flops, d.compiler_bytes / device.hbm_bytes_per_s,
             d.compiler_seconds or 0.0)


def paged_decode(result: Plan) -> estimate.PagedDecode:
  """The paged engine (pages of sampler.kv_page_size) in the dense decode plan's KV
  memory split into the sampler mesh's page shards, for `result.mean_episode_tokens`-token
  episodes (estimate.paged_decode)."""
  d, device = result.decode, result.device
  return estimate.paged_decode(result.sampler_batch, result.seq_len, result.mean_episode_tokens,
                               result.cfg.sampler.kv_page_size, d.compiler_flops,
                               d.compiler_bytes, device.peak_bf16_flops, device.hbm_bytes_per_s,
                               result.page_shards)


def format_plan(result: Plan) -> str:
  """Memory per device against HBM for each program, then FLOPs and the roofline."""
  gib = lambda x: f"{x / estimate.GiB:8.2f}"
  cfg, r = result.cfg, result.roofline
  lines = [f"plan {cfg.name}: seq_len={result.seq_len} rows={cfg.learner.batch_rows} "
           f"micro_batches={cfg.learner.micro_batches} attention={cfg.model.attention_impl} "
           f"remat={cfg.model.remat_policy}",
           f"{'program':<12} {'topology':<11} {'mesh':<28} {'args':>8} {'temps':>8} {'outputs':>8} "
           f"{'aliased':>8} {'code':>8} {'total':>8} {'HBM':>8} {'used':>6}"]
  for p in result.programs():
    mesh = ",".join(f"{k}={v}" for k, v in p.mesh_shape.items() if v > 1) or "1 device"
    m = p.memory
    lines.append(f"{p.name:<12} {p.topology:<11} {mesh:<28} {gib(m.arguments)} "
                 f"{gib(m.temporaries)} "
                 f"{gib(m.outputs)} {gib(m.aliased)} {gib(m.generated_code)} {gib(m.total)} "
                 f"{gib(result.device.hbm_bytes)} {m.total / result.device.hbm_bytes:6.1%}")
  lines.append("(GiB per device; total = args + outputs - aliased + temps + code)")
  if result.learner_attention:
    lines.append(f"train_step attention on {result.device.name}: {result.learner_attention}")
  if result.rated_as:
    compiled_for = sorted({p.topology for p in result.programs()})
    lines.append(f"ESTIMATE for {result.rated_as}: compiled by the TPU compiler for "
                 f"{' and '.join(compiled_for)} (the same programs and meshes) and rated with "
                 f"the {result.rated_as}'s memory and speed; not measured on a GPU")
  if result.shared_device:
    together = shared_total(result) / estimate.GiB
    lines.append(f"learner and sampler share each device: {together:.2f} GiB together")
  train = result.train
  compiled = "train step not compiled (--no-train)"
  if train is not None:
    compiler_time = (f", XLA optimal_seconds {train.compiler_seconds:.3g} s"
                     if train.compiler_seconds is not None else "")
    compiled = (f"XLA cost analysis {train.compiler_flops:.3e} per device{compiler_time} "
                "(loop bodies counted once: not a step total)")
  lines += [
      f"train FLOPs/step: model {result.model_flops:.3e}, with recompute "
      f"{result.hardware_flops:.3e} ({result.hardware_flops / result.devices:.3e} per device); "
      + compiled,
      f"roofline on {result.devices} x {result.device.name} "
      f"({result.device.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16 each): step >= "
      f"{r.step_seconds:.2f} s, MFU <= {r.mfu:.1%}, tokens/s <= {r.tokens_per_s:,.0f} "
      "(compute bound; communication not modelled)",
  ]
  if result.decode is not None:
    seconds = decode_seconds(result)
    lines.append(f"decode step (batch {result.sampler_batch}, cache {result.seq_len}): >= "
                 f"{seconds * 1e3:.2f} ms (max of FLOPs / peak and bytes accessed / HBM bandwidth, "
                 f"XLA cost analysis) -> <= {result.sampler_batch / seconds:,.0f} tokens/s")
    paged = paged_decode(result)
    lines.append(f"paged decode (same KV memory, mean episode {result.mean_episode_tokens} tokens, "
                 f"pages of {result.cfg.sampler.kv_page_size}): {paged.episodes} episodes "
                 f"({paged.pages_per_shard} pages per shard x {paged.shards} page shards) vs "
                 f"{result.sampler_batch} dense, step >= {paged.seconds * 1e3:.2f} ms -> <= "
                 f"{paged.tokens_per_s:,.0f} tokens/s (estimated from the dense step's bytes and "
                 "FLOPs)")
  if result.paged_decode is not None:
    blocks = "; ".join(b.describe() for b in result.kernel_blocks)
    if not blocks:
      why = f" ({result.attention})" if result.attention else ""
      lines.append(f"paged_decode attention on {result.device.name}: the reference path{why}")
    elif result.rated_as:  # the Pallas kernel is TPU-only: the proxy compiled it, a GPU does not
      lines.append(f"paged_decode attention kernel of the TPU proxy (per device): {blocks}; on "
                   f"{result.rated_as} the engine runs the reference attention path instead")
    else:
      lines.append(f"paged_decode attention kernel on {result.device.name} (per device): {blocks}")
  sampler = next((p for p in result.programs() if p.name in ("decode_step", "paged_decode")),
                 None)
  if sampler is not None and hardware.num_chips(sampler.topology) > result.device.host_chips:
    hosts = -(-hardware.num_chips(sampler.topology) // result.device.host_chips)
    lines.append(f"note: the sampler topology {sampler.topology} spans {hosts} hosts; these "
                 "figures are for one engine over all of them, run as one engine group: "
                 f"`sao-sampler --coordinator HOST:PORT --num-processes {hosts} --process-id I` "
                 "on each host (docs/guides/multi-host.md)")
  return "\n".join(lines)
