"""The `model` section of a run that starts from a checkpoint directory (`run.init`).

    cfg = resolve(cfg)            # load_config and every job call it
    check_init(cfg)               # a job, before it compiles: run.init is loadable
    check_dtypes(cfg.model, jax.devices())

`run.init` is the one name of the checkpoint a run starts from: a Hugging Face
directory (config.json + safetensors) or a `sao-convert` params directory
(model_config.json + params.safetensors). `resolve` reads the checkpoint's
architecture and fills the `model` section from it:

  - an architecture field (every `ModelConfig` field but `RUNTIME_FIELDS` and
    `DTYPE_FIELDS`) left at its `ModelConfig()` default takes the checkpoint's
    value; one the config sets must describe the same architecture, else the
    run is refused naming the field, the config's value and the checkpoint's.
    "Left at its default" means equal to it: writing `vocab_size=512` (the
    default) in a config file leaves it to the checkpoint too.
  - `param_dtype` / `compute_dtype` left at their default take the checkpoint's
    dtype (when it is one of `model.DTYPES`); a value the config sets is kept
    (numerics are a choice, not an architecture).
  - `RUNTIME_FIELDS` (attention kernel, remat, scan, LM-head chunk) are never
    in a checkpoint and stay as configured.
  - `run.tokenizer` left empty becomes the checkpoint directory when it holds a
    tokenizer.json (its chat template comes with it).

A `run.init` that does not exist yet is left alone here (configs are also
loaded on hosts that only plan or sample); `check_init` refuses it before a job
compiles. Resolving is idempotent: a resolved config resolves to itself.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Sequence

from sao_jax.config import hf_json, params_json
from sao_jax.config.model import DTYPES, ModelConfig

# Fields no checkpoint holds: how the model is run here, not what it is.
RUNTIME_FIELDS = ("logits_chunk", "attention_impl", "attention_block", "remat_policy",
                  "scan_layers")
DTYPE_FIELDS = ("param_dtype", "compute_dtype")
ARCHITECTURE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig)
                            if f.name not in RUNTIME_FIELDS + DTYPE_FIELDS)
_KINDS_HINT = ("pass 'random', a Hugging Face model directory (config.json and *.safetensors, "
               "e.g. from `huggingface-cli download`) or a sao-convert params directory")


@dataclasses.dataclass(frozen=True)
class InitCheckpoint:
  """What `run.init` names: its model config, its kind ("hf" or "params") and where
  its tokenizer is ("" when it ships none)."""
  model: ModelConfig
  kind: str
  tokenizer: str


def read_init(init: str) -> InitCheckpoint:
  """The checkpoint `run.init=init` names, read without its weights; ValueError (or
  FileNotFoundError) naming what is missing or unsupported."""
  path = pathlib.Path(init)
  if not path.is_dir():
    raise FileNotFoundError(f"run.init={init!r} is not a directory; {_KINDS_HINT}")
  tokenizer = str(path) if (path / "tokenizer.json").is_file() else ""
  if (path / hf_json.HF_CONFIG).is_file():
    weights = [*path.glob("*.safetensors"), *path.glob("*.safetensors.index.json")]
    if not weights:
      legacy = sorted(p.name for p in path.glob("*.bin"))
      found = f" (it holds {', '.join(legacy[:3])}: PyTorch pickles)" if legacy else ""
      raise FileNotFoundError(
          f"run.init={init!r} has a config.json but no *.safetensors weights{found}; sao_jax "
          "reads safetensors only: download the safetensors files of the checkpoint, or "
          "re-save it with transformers' save_pretrained(safe_serialization=True)")
    try:
      model = hf_json.config_from_hf(path)
    except ValueError as error:
      raise ValueError(f"run.init={init!r}: {error}") from None
    return InitCheckpoint(model, "hf", tokenizer)
  if (path / params_json.CONFIG_FILE).is_file():
    model, head = params_json.load_model_config(path)
    if head != "lm":
      raise ValueError(f"run.init={init!r} holds a {head!r} head, not a policy; pass the "
                       "policy's params directory")
    if not (path / params_json.PARAMS_FILE).is_file():
      raise FileNotFoundError(f"run.init={init!r} has {params_json.CONFIG_FILE} but no "
                              f"{params_json.PARAMS_FILE}; the directory is incomplete")
    return InitCheckpoint(model, "params", tokenizer)
  raise FileNotFoundError(f"run.init={init!r} holds neither {hf_json.HF_CONFIG} nor "
                          f"{params_json.CONFIG_FILE}; {_KINDS_HINT}")


def architecture(model: ModelConfig) -> dict[str, Any]:
  """What identifies a checkpoint's architecture: its exported config.json without
  the dtype (two configs with the same architecture load the same weights)."""
  return {k: v for k, v in hf_json.hf_config(model).items() if k != "dtype"}


def merge_model(configured: ModelConfig, checkpoint: ModelConfig, init: str) -> ModelConfig:
  """`configured` with its defaulted fields taken from `checkpoint` (module docstring);
  ValueError naming every field the config sets that disagrees with the checkpoint."""
  defaults = ModelConfig()
  updates, conflicts = {}, []
  for name in ARCHITECTURE_FIELDS:
    ours, theirs = getattr(configured, name), getattr(checkpoint, name)
    if ours == getattr(defaults, name):
      updates[name] = theirs
    elif ours != theirs:
      conflicts.append((name, ours, theirs))
  for name in DTYPE_FIELDS:
    if getattr(configured, name) == getattr(defaults, name) and getattr(checkpoint, name) in DTYPES:
      updates[name] = getattr(checkpoint, name)
  merged = dataclasses.replace(configured, **updates)
  if conflicts and not _same_architecture(merged, checkpoint):
    listed = "; ".join(f"model.{name}={ours!r} but the checkpoint has {theirs!r}"
                       for name, ours, theirs in conflicts)
    raise ValueError(f"run.init={init!r} disagrees with the config's model section: {listed}. "
                     "Delete those fields from the config (fields left at their defaults are "
                     "read from the checkpoint) or point run.init at the checkpoint they "
                     "describe")
  return merged


def _same_architecture(a: ModelConfig, b: ModelConfig) -> bool:
  """Whether `a` and `b` load the same weights the same way; a config that does not
  validate describes no architecture."""
  try:
    a.validate()
  except ValueError:
    return False
  return architecture(a) == architecture(b)


def resolve(cfg):
  """`cfg` (a `Config`) with its model section and tokenizer filled from `run.init`
  (module docstring); unchanged for 'random' or a path that does not exist here."""
  init = cfg.run.init
  if init == "random" or not pathlib.Path(init).exists():
    return cfg
  checkpoint = read_init(init)
  run = cfg.run
  if not run.tokenizer and checkpoint.tokenizer:
    run = dataclasses.replace(run, tokenizer=checkpoint.tokenizer)
  return dataclasses.replace(cfg, model=merge_model(cfg.model, checkpoint.model, init), run=run)


def check_init(cfg) -> None:
  """FileNotFoundError / ValueError unless `run.init` is 'random' or a loadable
  checkpoint of the config's architecture: what a job checks before it compiles."""
  if cfg.run.init != "random":
    merge_model(cfg.model, read_init(cfg.run.init).model, cfg.run.init)


# Native bfloat16 arithmetic on NVIDIA GPUs starts with compute capability 8.0 (Ampere).
_GPU_BF16_CAPABILITY = (8, 0)


def check_dtypes(model: ModelConfig, devices: Sequence[Any]) -> None:
  """ValueError when the devices lack a dtype the model section asks for (bfloat16
  on a GPU older than Ampere); CPUs and TPUs have both of `model.DTYPES`."""
  wanted = sorted({model.param_dtype, model.compute_dtype} & {"bfloat16"})
  if not wanted:
    return
  for device in devices:
    capability = getattr(device, "compute_capability", None)
    if device.platform != "gpu" or capability is None:
      continue
    major, minor = (int(part) for part in str(capability).split(".")[:2])
    if (major, minor) < _GPU_BF16_CAPABILITY:
      fields = [name for name in DTYPE_FIELDS if getattr(model, name) == "bfloat16"]
      raise ValueError(
          f"model.{fields[0]}='bfloat16' but {getattr(device, 'device_kind', device)} "
          f"(compute capability {capability}) has no bfloat16 arithmetic (it needs "
          f"{'.'.join(map(str, _GPU_BF16_CAPABILITY))}+); set "
          + " and ".join(f"--set model.{name}=float32" for name in fields))


def describe(model: ModelConfig) -> str:
  """The model section as one JSON object, for the run's log."""
  return json.dumps(dataclasses.asdict(model), sort_keys=False)
