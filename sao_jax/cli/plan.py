"""`sao-plan`: prove a pod configuration compiles and fits before paying for the pod.

  sao-plan --config configs/qwen3_4b.py:v6e-8
  sao-plan --config configs/qwen3_8b_v5p32.py --topology v5p:2x2x4 [--set a.b=c ...]
           [--seq-len 32768] [--sampler-topology v5p:2x2x2] [--sampler-batch 64]
           [--sampler-mesh data=1,fsdp=-1,tensor=1,expert=1] [--hbm-fraction 0.95]
           [--mean-episode-tokens 4096] [--no-decode | --no-train]

A config made for a host (`FILE.py:HOST`, `run.host`) needs no topology: the
chips its learner and sampler processes open are planned (`aot.host_targets`).
Runs on any CPU machine with libtpu installed (`pip install "jax[tpu]==<jax version>"`):
AOT-compiles the learner's train step and the sampler's decode step for the
named TPU topology on abstract (never allocated) arrays, prints per-device
memory against HBM, FLOPs and the roofline step time / MFU / tokens per second,
and exits 1 with what to change when a program does not fit. Beside the dense
decode figures it prints the paged engine's: episodes that fit in the same KV
memory and the decode tokens/s bound, for episodes of --mean-episode-tokens
(default the config's `sampler.expected_episode_tokens`, else seq_len / 8); with `sampler.kv_layout="paged"` it also compiles the
paged engine's decode call at that many slots over that memory (the
`paged_decode` row), so the concurrency it claims is one the compiler fits, and
prints the Pallas attention kernel's block sizes and VMEM limit in that call: the
ones a TPU of the topology's generation runs (`sao_jax.models.paged_blocks`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import jax

from sao_jax.cli import flags
from sao_jax.config import MeshConfig
from sao_jax.jobs import startup
from sao_jax.planning import aot


def _mesh(text: str) -> MeshConfig:
  """'data=1,fsdp=-1' -> MeshConfig (unnamed axes keep their defaults)."""
  try:
    return MeshConfig.parse(text)
  except ValueError as error:
    raise argparse.ArgumentTypeError(str(error)) from None


def run(args: argparse.Namespace) -> int:
  cfg = startup.load(args.config, args.overrides)
  seq_len = args.seq_len or cfg.sampler.max_seq_len
  if args.topology:
    targets = aot.Targets(args.topology, args.sampler_topology, None, False)
  else:  # a config made for a host: what its learner and sampler processes open
    targets = aot.host_targets(cfg)
    print(f"run.host={cfg.run.host}: learner on {targets.topology}, sampler on "
          f"{targets.sampler_topology}" + (f", rated as {targets.rate_as}" if targets.rate_as
                                           else ""))
  result = aot.plan(cfg, targets.topology, seq_len, sampler_topology=targets.sampler_topology,
                    sampler_mesh=args.sampler_mesh, sampler_batch=args.sampler_batch,
                    hbm_fraction=args.hbm_fraction, with_decode=not args.no_decode,
                    mean_episode_tokens=args.mean_episode_tokens, rate_as=targets.rate_as,
                    shared_device=targets.shared_device and not args.no_train,
                    with_train=not args.no_train)
  print(aot.format_plan(result))
  aot.check_fits(result)
  print(f"fits: every program is within {args.hbm_fraction:.0%} of "
        f"{result.device.hbm_bytes / 2**30:.0f} GiB HBM per device")
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="sao-plan", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="a configs/<name>.py file")
  parser.add_argument("--topology", default=None,
                      help="TPU topology, e.g. v5p:4x4x4 (default: the processes of the "
                      "config's run.host, e.g. configs/qwen3_4b.py:v6e-8)")
  flags.add_set(parser)
  parser.add_argument("--seq-len", type=int, default=None,
                      help="tokens per trajectory and KV-cache slots (default: "
                      "sampler.max_seq_len)")
  parser.add_argument("--sampler-topology", default=None,
                      help="the devices one sampler engine spans (default: the learner's "
                      "topology): one host, e.g. v5p:2x2x1 (4 chips), or the hosts of one "
                      "engine group (sao-sampler --coordinator)")
  parser.add_argument("--sampler-batch", type=int, default=None,
                      help="sequences decoded at once (default: sampler.slots)")
  parser.add_argument("--sampler-mesh", type=_mesh, default=None,
                      help="the sampler's mesh, e.g. data=4,fsdp=1,tensor=4 (default: the "
                      "config's sampler.mesh, else its mesh; to run what the plan fits, set "
                      "sampler.mesh in the config)")
  parser.add_argument("--hbm-fraction", type=float, default=0.95,
                      help="share of HBM a program may use (the runtime keeps some)")
  parser.add_argument("--mean-episode-tokens", type=int, default=None,
                      help="assumed mean episode length for the paged engine's figures "
                      "(default: the config's sampler.expected_episode_tokens, else seq_len / 8)")
  parser.add_argument("--no-decode", action="store_true", help="plan the train step only")
  parser.add_argument("--no-train", action="store_true",
                      help="plan the sampler's programs only (a sampler slice, e.g. for "
                      "sao-sampler; much faster for large models)")
  return parser


def main(argv: Sequence[str] | None = None) -> None:
  parser = build_parser()
  args = parser.parse_args(argv)
  # Compile-only TPU devices need no accelerator: never let jax claim one (on a
  # TPU VM the chips may be busy training).
  jax.config.update("jax_platforms", "cpu")
  try:
    sys.exit(run(args))
  except aot.DoesNotFit as error:
    sys.exit(f"sao-plan: {error}")
  except (ValueError, FileNotFoundError, ImportError) as error:
    sys.exit(f"sao-plan: error: {error}")


if __name__ == "__main__":
  main()
