"""`sao-train`: train with SAO (or a baseline variant) as a config file says.

  sao-train --config configs/demo_cpu.py [--set section.field=value ...] [--resume [MODE]]
  sao-train --plot RUN_DIR        # redraw RUN_DIR/curves.png from its metrics.jsonl
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from sao_jax.config import load_config
from sao_jax.config.run import RESUME_MODES
from sao_jax.metrics import plot_curves


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="sao-train", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", help="a configs/<name>.py file")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="SECTION.FIELD=VALUE", help="override a config field (repeatable)")
  parser.add_argument("--resume", nargs="?", const="always", choices=RESUME_MODES,
                      metavar="MODE",
                      help="sets run.resume: 'auto' continues the run in the checkpoint "
                      "directory when its config is this one (refused when not) and starts "
                      "fresh when there is none, so relaunching the same command after a "
                      "preemption continues; bare --resume ('always') continues whatever "
                      "changed; 'never' (the default) refuses existing checkpoints")
  parser.add_argument("--plot", metavar="RUN_DIR", help="only redraw the curves of a run")
  args = parser.parse_args(argv)
  try:
    if args.plot:
      print(f"wrote {plot_curves(args.plot)}")
      return
    if not args.config:
      parser.error("--config is required (or --plot RUN_DIR)")
    overrides = list(args.overrides)
    if args.resume is not None:
      overrides.append(f"run.resume={args.resume}")
    cfg = load_config(args.config, overrides)
    # After argument errors: importing JAX (with sao_jax.train) takes seconds.
    from sao_jax import train

    summary = train.run(cfg, resume=None,
                        log=lambda line: print(line, flush=True))
  except (ValueError, FileNotFoundError) as error:
    parser.exit(2, f"error: {error}\n")
  print(f"done: {summary['steps_done']} steps ({summary['stopped_by']}); "
        f"held-out accuracy {summary.get('eval/accuracy', float('nan')):.3f}")
  print(f"run directory: {cfg.run.run_dir}  (metrics.jsonl, tensorboard/, checkpoints/)")
  print(f"plot: {summary['plot']}")


if __name__ == "__main__":
  main(sys.argv[1:])
