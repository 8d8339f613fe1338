"""`sao-eval`: held-out accuracy of a checkpointed policy.

  sao-eval --config configs/demo_cpu.py [--set ...] [--step N] [--episodes N]

Restores the policy of checkpoint `--step` (default: latest) from the run's
checkpoint directory and runs the same greedy held-out evaluation as training
(`sao_jax.evaluation.evaluate_checkpoint`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from sao_jax.config import load_config


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="sao-eval", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="the run's configs/<name>.py file")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="SECTION.FIELD=VALUE")
  parser.add_argument("--step", type=int, help="checkpoint step (default: latest)")
  parser.add_argument("--episodes", type=int, help="held-out episodes (default: run.eval_episodes)")
  args = parser.parse_args(argv)
  overrides = args.overrides + ([] if args.episodes is None else
                                [f"run.eval_episodes={args.episodes}"])
  try:
    cfg = load_config(args.config, overrides)
    from sao_jax.evaluation import evaluate_checkpoint

    result = evaluate_checkpoint(cfg, args.step)
  except (ValueError, FileNotFoundError) as error:
    parser.exit(2, f"error: {error}\n")
  print(json.dumps(result, indent=2))


if __name__ == "__main__":
  main(sys.argv[1:])
