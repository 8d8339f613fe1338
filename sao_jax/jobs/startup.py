"""What every job checks of its config when it starts, before any sampler starts or
anything compiles:

    cfg = startup.check(cfg)                     # a Config built in code
    cfg = startup.load(path, overrides)          # a config file (what the commands do)
    cfg = startup.check(cfg, lambda cfg: [8])    # and a paged engine on a mesh of 8 devices
    startup.sampler_meshes(cfg, devices)         -> the sampler processes' meshes to check
    startup.train_sampler_meshes(cfg, host)      -> those of sao-train's local samplers

`Config.validate()` checks what the config itself can know (types, ranges, one
section against another). The names a config gives to code are checked against
that code here, the layer that may import it:

  - the environment (`env.name`, `env.options`, the task source, `env.reward_fn`):
    `sao_jax.envs.registry.check` imports it and checks its options;
  - every row of a file task source (JSONL, Parquet, save_to_disk):
    `registry.check_tasks` reads them all, so a bad row is named (file, row,
    column) by `sao-train --check` and refused before a run or evaluation starts;
  - the variant's advantage estimator and policy loss: `sao_jax.learner.step.
    check_variant`, against the registries where those functions live;
  - the paged pool against the meshes the job's engines split it over
    (`check_page_split`): D = data x fsdp page shards of the sampler mesh
    (`cfg.sampler_mesh()`, `sao_jax.models.paged_mesh`) must divide sampler.slots
    and the pool's pages, the refusal the engine itself would make once built,
    after the policy was restored or the learner started.

The meshes are given as device counts, one per engine, since only the job knows
them: sao-eval's engine spans all devices; sao-train's sampler processes use the
mesh only with sampler.sharded, over their run.device_split shares or else over
the host's devices; sao-sampler's workers over their host's devices, which its
supervisor (pinned to the CPU) does not open. A count not known yet is None:
then only a mesh whose data and fsdp sizes are fixed is checked, since a -1 axis
there takes the device count, and counting devices starts the backend, which
sao-train's command must not do before `sao_jax.jobs.train.claim_tpu_chips` and
`jax.distributed` (sao-train checks again in `train.run`, after them, with the
host's count).

What sao-train reads from this host in its first minute is checked by
`check_train_inputs` (`sao-train` and `sao-train --check` call it, on the machine
that trains): `run.init` a loadable checkpoint, `run.tokenizer` an existing
tokenizer, and a run whose tasks are dataset rows (which hold no texts to train
a tokenizer on, nor demonstrations) given a tokenizer and no SFT warm-start.

Each error names the field, the value and what is allowed. `no_policy_update` is a
warning, not an error: a critic variant's run whose steps end before the critic's
warm-up does (sao-train logs it at start-up, `--check` prints it).
"""

from __future__ import annotations

import pathlib
from typing import Callable, Sequence

from sao_jax.config import MESH_AXES, Config, init_model, load_config
from sao_jax.config.dataset import DATASET_SOURCES
from sao_jax.envs import registry
from sao_jax.learner import step
from sao_jax.models import paged_mesh


def check(cfg: Config, meshes: Callable[[Config], Sequence[int | None]] = lambda cfg: ()
          ) -> Config:
  """`cfg`, validated whole (module docstring); ValueError naming what is wrong.
  `meshes(cfg)`, asked once the rest is valid: the device count of each sampler mesh
  the job lays a paged engine over (None: not known yet), each `check_page_split`."""
  cfg.validate()
  registry.check(cfg.env)
  registry.check_tasks(cfg.env)
  step.check_variant(cfg.algorithm)
  for devices in meshes(cfg):
    if devices is not None:
      cfg.sampler_mesh_shape(devices)  # a dense engine's mesh too
    check_page_split(cfg, devices)
  return cfg


def load(path: str | pathlib.Path, overrides: Sequence[str] = (),
         meshes: Callable[[Config], Sequence[int | None]] = lambda cfg: ()) -> Config:
  """`sao_jax.config.load_config(path, overrides)`, then `check`ed (with `meshes`)."""
  return check(load_config(path, overrides), meshes)


# How to build a tokenizer for a dataset run offline (`sao_jax.cli.make_tokenizer`).
MAKE_TOKENIZER = "python -m sao_jax.cli.make_tokenizer --config CONFIG --out DIR"


def check_train_inputs(cfg: Config) -> None:
  """FileNotFoundError / ValueError naming the field and the fix unless what a training
  run reads at its start is there (module docstring). `cfg` is resolved
  (`init_model.resolve`: a checkpoint with a tokenizer.json fills `run.tokenizer`)."""
  init_model.check_init(cfg)
  tokenizer = cfg.run.tokenizer
  if tokenizer:
    path = pathlib.Path(tokenizer)
    if not (path / "tokenizer.json" if path.is_dir() else path).is_file():
      raise FileNotFoundError(
          f"run.tokenizer={tokenizer!r} is not a tokenizer.json nor a directory holding one "
          "on this host; name the tokenizer.json of the model you start from (or its "
          f"directory), or build one for a dataset run: {MAKE_TOKENIZER}")
  source = registry.resolve(cfg.env).task_source
  if source not in DATASET_SOURCES:
    return
  if cfg.run.sft_steps:
    raise ValueError(f"run.sft_steps={cfg.run.sft_steps} but env.task_source={source!r}: dataset "
                     "rows hold no demonstrations to warm-start on; set run.sft_steps=0")
  copy = cfg.run.tokenizer_file
  # A resumed run has its copy; a bucket run directory needs run.tokenizer (RunConfig).
  if not tokenizer and not pathlib.Path(copy).is_file():
    raise ValueError(f"run.tokenizer='' but env.task_source={source!r}: dataset rows hold no "
                     "texts to train the run's own tokenizer on; set run.tokenizer to the "
                     "tokenizer.json of the model you start from (or its directory; run.init=DIR "
                     "sets it when DIR holds one), or build one from the dataset offline: "
                     f"{MAKE_TOKENIZER}, then --set run.tokenizer=DIR")


def no_policy_update(cfg: Config) -> str | None:
  """The start-up warning of a critic variant whose `learner.steps` do not exceed its
  value-only steps (`step.value_only_steps`): such a run never updates the policy.
  None for any other run. A warning, not a refusal: training the critic alone (to
  resume from later) is a use."""
  value_only = step.value_only_steps(cfg.learner, cfg.algorithm)
  learner = cfg.learner
  if not value_only or learner.steps > value_only:
    return None
  return (f"warning: learner.steps={learner.steps} does not exceed learner.value_pretrain_steps="
          f"{learner.value_pretrain_steps} + learner.critic_warmup_steps="
          f"{learner.critic_warmup_steps} (algorithm.variant={cfg.algorithm.variant!r} trains "
          "its critic alone first): every step of this run is value-only and no policy update "
          f"would happen; set learner.steps above {value_only} or lower "
          "learner.critic_warmup_steps")


def check_page_split(cfg: Config, devices: int | None) -> None:
  """ValueError, naming the count, the page shards and the fix, unless the paged pool's
  slots and pages split over the page shards of the sampler mesh (`cfg.sampler_mesh()`)
  over `devices` devices (`paged_mesh.check_split`, the engine's own check). With
  `devices` None only a mesh whose data and fsdp sizes are fixed is checked (module
  docstring); a dense cache has no page shards."""
  if cfg.sampler.kv_layout != "paged":
    return
  mesh = cfg.sampler_mesh()
  if devices is not None:
    shape = cfg.sampler_mesh_shape(devices)
  elif -1 in (mesh.data, mesh.fsdp):
    return
  else:  # the shards are data x fsdp: a -1 tensor or expert axis does not change them
    shape = {axis: getattr(mesh, axis) for axis in MESH_AXES}
  paged_mesh.check_split(cfg.sampler.slots, cfg.sampler.num_kv_pages(), shape)


def sampler_meshes(cfg: Config, devices: Sequence[int | None]) -> list[int | None]:
  """The meshes of sampler processes with `devices` devices each (None: not known
  here) that lay their engines over the sampler mesh: all of them with
  sampler.sharded, else none (each engine then runs on one device, one page shard)."""
  return list(devices) if cfg.sampler.sharded else []


def train_sampler_meshes(cfg: Config, host_devices: int | None) -> list[int | None]:
  """`sampler_meshes` of sao-train's run.num_samplers local sampler processes: each
  opens its run.device_split share, or without a split all `host_devices` of the
  host (`sao_jax.sharding.device_split`)."""
  split = cfg.run.device_split
  return sampler_meshes(cfg, split[1:] if split else [host_devices] * cfg.run.num_samplers)
