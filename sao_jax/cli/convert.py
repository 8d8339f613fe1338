"""`sao-convert`: Hugging Face checkpoint directory <-> sao_jax params directory, for
every architecture of `sao_jax.config.families` (Qwen3, Qwen3-MoE, Qwen2.5, Llama 3.x,
Gemma 3 text).

  sao-convert hf-to-sao --hf_dir ./Qwen3-0.6B --out ./params
  sao-convert sao-to-hf --params ./params --out ./exported [--tokenizer_dir ./Qwen3-0.6B]
  sao-convert lora-to-hf --config configs/x.py [--set ...] [--step N] --out ./merged
                         [--peft_out ./adapter] [--tokenizer_dir ./Qwen3-0.6B]

The sao_jax format is described in `sao_jax.models.params_io` (model_config.json
plus params.safetensors keyed by param path). `sao-to-hf` writes a directory
that `transformers.AutoModelForCausalLM.from_pretrained` loads. `lora-to-hf`
takes a LoRA run (`lora.enabled`) by its config: its checkpoint's adapters
(latest, or `--step`) on the base from `run.init`, written merged as an HF
directory and, with `--peft_out`, as a PEFT adapter directory for that base
(`peft.PeftModel.from_pretrained(base_model, ADAPTER_DIR)`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from sao_jax.config import load_config
from sao_jax.models import hf, params_io, peft_io


def run(args: argparse.Namespace) -> None:
  if args.command == "hf-to-sao":
    cfg, params = hf.load_hf(args.hf_dir)
    params_io.save_params(args.out, params, cfg)
    print(f"wrote sao_jax params ({cfg.num_hidden_layers} layers) to {args.out}")
  elif args.command == "lora-to-hf":
    export_lora(args)
  else:
    cfg, head, params = params_io.load_params(args.params)
    if head != "lm":
      raise ValueError(f"{args.params!r} holds {head!r} params; only policy ('lm') params export to HF")
    hf.export_hf(params, cfg, args.out, max_shard_bytes=args.max_shard_mb * 2**20,
                 tokenizer_dir=args.tokenizer_dir)
    print(f"wrote Hugging Face checkpoint to {args.out}")


def export_lora(args: argparse.Namespace) -> None:
  from sao_jax.jobs.evaluate import restore_state
  from sao_jax.learner.state import policy_weights

  cfg = load_config(args.config, args.overrides)
  if not cfg.lora.enabled:
    raise ValueError(f"{args.config}: lora.enabled is false; export its checkpoints' full "
                     "params with sao-eval's run or sao-to-hf instead")
  state, meta = restore_state(cfg, args.step)
  hf.export_hf(policy_weights(cfg, state), cfg.model, args.out,
               max_shard_bytes=args.max_shard_mb * 2**20, tokenizer_dir=args.tokenizer_dir)
  print(f"wrote the merged policy of step {meta['step']} to {args.out}")
  if args.peft_out:
    peft_io.export_peft(state.policy_adapters, cfg.model, cfg.lora, args.peft_out,
                        base_model=None if cfg.run.init == "random" else cfg.run.init)
    print(f"wrote its PEFT adapter directory to {args.peft_out}")


def _shard_mb(text: str) -> int:
  """--max_shard_mb: a whole number of MiB >= 1 (0 or less wrote one file per tensor)."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB >= 1, e.g. 5120")
  return value


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="sao-convert", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True)
  to_sao = sub.add_parser("hf-to-sao", help="HF directory -> sao_jax params directory")
  to_sao.add_argument("--hf_dir", required=True)
  to_sao.add_argument("--out", required=True)
  to_hf = sub.add_parser("sao-to-hf", help="sao_jax params directory -> HF directory")
  to_hf.add_argument("--params", required=True)
  to_hf.add_argument("--out", required=True)
  to_hf.add_argument("--tokenizer_dir", default=None, help="copy tokenizer files from here")
  to_hf.add_argument("--max_shard_mb", type=_shard_mb, default=5120)
  from_lora = sub.add_parser("lora-to-hf", help="LoRA run checkpoint -> merged HF directory "
                            "(and a PEFT adapter directory)")
  from_lora.add_argument("--config", required=True, help="the run's configs/<name>.py")
  from_lora.add_argument("--set", dest="overrides", action="append", default=[],
                         metavar="SECTION.FIELD=VALUE", help="the run's overrides (repeatable)")
  from_lora.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  from_lora.add_argument("--out", required=True)
  from_lora.add_argument("--peft_out", default=None)
  from_lora.add_argument("--tokenizer_dir", default=None, help="copy tokenizer files from here")
  from_lora.add_argument("--max_shard_mb", type=_shard_mb, default=5120)
  args = parser.parse_args(argv)
  try:
    run(args)
  except (ValueError, OSError) as err:  # OSError: a file where --out goes, a full disk
    sys.exit(f"sao-convert: {err}")


if __name__ == "__main__":
  main()
