"""LoRA adapters out as a PEFT adapter directory (what `peft.PeftModel.from_pretrained` loads).

  export_peft(adapters, model_cfg, lora_cfg, out_dir, base_model=None)

PEFT's LoRA layer adds s * lora_B.weight @ lora_A.weight to an `nn.Linear`'s
[out, in] weight, with s = lora_alpha / r. Ours adds s * A B to our [in, out]
view of the kernel (`sao_jax.models.lora`), so lora_A.weight = A^T [r, in] and
lora_B.weight = B^T [out, r]; the flattened in/out orders match HF's (q_proj's
out is (head, head_dim), o_proj's in is (head, head_dim), as `sao_jax.models.hf`
converts them). Files: `adapter_config.json` and `adapter_model.safetensors`
keyed `base_model.model.model.layers.{i}.{self_attn|mlp}.{name}.lora_{A|B}.weight`.
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from sao_jax.config import LoraConfig, ModelConfig
from sao_jax.models import lora
from sao_jax.models.params_io import write_safetensors
from sao_jax.models.transformer import Params

_HF_BLOCKS = {"attn": "self_attn", "mlp": "mlp"}  # our module name -> HF's, inside a layer


def hf_module(path: str) -> str:
  """'layers/3/attn/q_proj' -> 'model.layers.3.self_attn.q_proj'."""
  layers, index, block, name = path.split("/")
  if layers != "layers" or block not in _HF_BLOCKS:
    raise ValueError(f"{path!r} is not a decoder-layer projection; PEFT export covers those only")
  return f"model.layers.{index}.{_HF_BLOCKS[block]}.{name}"


def adapter_config(lora_cfg: LoraConfig, base_model: str | None) -> dict:
  """PEFT's `adapter_config.json` for plain LoRA with our rank, alpha and targets."""
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora_cfg.rank,
          "lora_alpha": lora_cfg.alpha, "target_modules": sorted(lora_cfg.targets),
          "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
          "use_dora": False, "init_lora_weights": True, "inference_mode": True,
          "base_model_name_or_path": base_model}


def export_peft(adapters: Params, model_cfg: ModelConfig, lora_cfg: LoraConfig,
                out_dir: str | pathlib.Path, base_model: str | None = None) -> None:
  """Writes `adapters` as a PEFT LoRA adapter directory for the HF export of the base."""
  expected = lora.adapter_paths(model_cfg, lora_cfg)
  flat = lora.flat_adapters(adapters)
  if set(flat) != set(expected):
    raise ValueError(f"export_peft: the adapters cover {sorted(set(flat) ^ set(expected))[:4]} "
                     "differently from lora.targets; pass adapters trained with this config")
  tensors = {}
  for path, ab in flat.items():
    prefix = f"base_model.model.{hf_module(path)}"
    tensors[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(np.asarray(jax.device_get(ab["a"])).T)
    tensors[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(np.asarray(jax.device_get(ab["b"])).T)
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  write_safetensors(tensors, out_dir / "adapter_model.safetensors", metadata={"format": "pt"})
  (out_dir / "adapter_config.json").write_text(json.dumps(adapter_config(lora_cfg, base_model),
                                                          indent=2))
