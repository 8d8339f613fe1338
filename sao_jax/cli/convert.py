"""`sao-convert`: a run's checkpoint -> Hugging Face directory, and Hugging Face
checkpoint directory <-> sao_jax params directory, for every architecture of
`sao_jax.config.families` (Qwen3, Qwen3-MoE, Qwen2.5, Llama 3.x, Gemma 3 text).

  sao-convert run-to-hf --config configs/x.py [--set ...] [--step N] --out ./exported
                        [--value-out ./critic] [--peft-out ./adapter] [--tokenizer-dir DIR]
  sao-convert hf-to-sao --hf-dir ./Qwen3-0.6B --out ./params
  sao-convert sao-to-hf --params ./params --out ./exported [--tokenizer-dir ./Qwen3-0.6B]

`run-to-hf` takes any run by its config and overrides, as given to sao-train:
the policy of its newest checkpoint (or `--step`), full params or, under LoRA,
the base from `run.init` merged with the adapters, written as a directory
`transformers.AutoModelForCausalLM.from_pretrained` loads, with the tokenizer and
chat template the run trained with (`sao_jax.jobs.export`). `--value-out` also
writes the value model as a sao_jax params directory, `--peft-out` (LoRA runs)
the adapters as a PEFT directory for that base
(`peft.PeftModel.from_pretrained(base_model, ADAPTER_DIR)`). The params are
restored onto this host's devices; `JAX_PLATFORMS=cpu sao-convert ...` uses the
host's CPU instead. `lora-to-hf` is its former name, kept for one release.

The underscore spellings of earlier releases (--hf_dir, --tokenizer_dir,
--max_shard_mb, --peft_out) still work, for one release.

The sao_jax format is described in `sao_jax.models.params_io` (model_config.json
plus params.safetensors keyed by param path). `sao-to-hf` writes a policy's such
directory as a Hugging Face directory (a value model's is refused: it has no
Hugging Face class).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from sao_jax.cli import flags
from sao_jax.jobs import startup
from sao_jax.models import hf, params_io

# Old spelling -> flag (hidden aliases, kept for one release).
ALIASES = {"--hf_dir": "--hf-dir", "--tokenizer_dir": "--tokenizer-dir",
           "--max_shard_mb": "--max-shard-mb", "--peft_out": "--peft-out"}


def run(args: argparse.Namespace) -> None:
  if args.command == "hf-to-sao":
    cfg, params = hf.load_hf(args.hf_dir)
    params_io.save_params(args.out, params, cfg)
    print(f"wrote sao_jax params ({cfg.num_hidden_layers} layers) to {args.out}")
  elif args.command in ("run-to-hf", "lora-to-hf"):
    from sao_jax.jobs import export

    export.export_run(startup.load(args.config, args.overrides), args.out, step=args.step,
                      value_dir=args.value_out, peft_dir=args.peft_out,
                      tokenizer_dir=args.tokenizer_dir,
                      max_shard_bytes=args.max_shard_mb * 2**20)
  else:
    cfg, head, params = params_io.load_params(args.params)
    if head != "lm":
      raise ValueError(f"{args.params!r} holds {head!r} params; only policy ('lm') params export to HF")
    hf.export_hf(params, cfg, args.out, max_shard_bytes=args.max_shard_mb * 2**20,
                 tokenizer_dir=args.tokenizer_dir)
    print(f"wrote Hugging Face checkpoint to {args.out}")


def _shard_mb(text: str) -> int:
  """--max-shard-mb: a whole number of MiB >= 1 (0 or less wrote one file per tensor)."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB >= 1, e.g. 5120")
  return value


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="sao-convert", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  to_sao = sub.add_parser("hf-to-sao", help="HF directory -> sao_jax params directory")
  to_sao.add_argument("--hf-dir", dest="hf_dir", required=True,
                      help="Hugging Face checkpoint directory (config.json + safetensors)")
  to_sao.add_argument("--out", required=True, help="sao_jax params directory to write")
  to_hf = sub.add_parser("sao-to-hf", help="sao_jax params directory -> HF directory")
  to_hf.add_argument("--params", required=True,
                     help="sao_jax params directory (hf-to-sao's --out); a run's checkpoint "
                     "exports with run-to-hf")
  to_hf.add_argument("--out", required=True, help="Hugging Face directory to write")
  _export_flags(to_hf)
  from_run = sub.add_parser("run-to-hf", aliases=["lora-to-hf"],
                            help="a run's checkpoint (full or LoRA) -> HF directory with the "
                            "run's tokenizer and chat template")
  from_run.add_argument("--config", required=True, help="the run's configs/<name>.py")
  flags.add_set(from_run, help="the run's overrides, as given to sao-train (repeatable)")
  from_run.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  from_run.add_argument("--out", required=True,
                        help="Hugging Face directory to write the policy to (LoRA: merged)")
  from_run.add_argument("--value-out", dest="value_out", default=None,
                        help="also write the value model here, as a sao_jax params directory")
  from_run.add_argument("--peft-out", dest="peft_out", default=None,
                        help="LoRA runs: also write the adapters as a PEFT adapter directory here")
  _export_flags(from_run)
  return parser


def _export_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--tokenizer-dir", dest="tokenizer_dir", default=None,
                      help="copy tokenizer files from here (run-to-hf: instead of the run's)")
  parser.add_argument("--max-shard-mb", dest="max_shard_mb", type=_shard_mb, default=5120,
                      help="largest safetensors shard in MiB (default 5120)")


def main(argv: Sequence[str] | None = None) -> None:
  parser = build_parser()
  args = flags.parse(parser, argv, ALIASES)
  try:
    run(args)
  except (ValueError, OSError) as err:  # OSError: a file where --out goes, a full disk
    sys.exit(f"sao-convert: {err}")


if __name__ == "__main__":
  main()
