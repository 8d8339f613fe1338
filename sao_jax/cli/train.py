"""`sao-train`: train with SAO (or a baseline variant) as a config file says.

  sao-train --config configs/demo_cpu.py [--set section.field=value ...] [--resume MODE]
  sao-train --config configs/demo_cpu.py [--set ...] --check   # validate, print, exit
  sao-train --config configs/demo_cpu.py --profile 3   # trace 3 steps (RUN_DIR/profile)
  sao-train --plot RUN_DIR        # redraw RUN_DIR/curves.png from its metrics.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Sequence

from sao_jax.cli import flags
from sao_jax.config.run import RESUME_MODES
from sao_jax.jobs import startup
from sao_jax.run.metrics import plot_curves
from sao_jax.run.profile import ProfileSteps


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="sao-train", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", help="a configs/<name>.py file")
  flags.add_set(parser)
  parser.add_argument("--resume", nargs="?", const="always", choices=RESUME_MODES,
                      metavar="MODE",
                      help="sets run.resume: 'auto' continues the run in the checkpoint "
                      "directory when its config is this one (refused when not) and starts "
                      "fresh when there is none, so relaunching the same command after a "
                      "preemption continues; bare --resume ('always') continues whatever "
                      "changed; 'never' (the default) refuses existing checkpoints")
  parser.add_argument("--check", action="store_true",
                      help="validate the config and the --set overrides, print the resolved "
                      "config as JSON and exit, without compiling or starting anything")
  parser.add_argument("--profile", metavar="STEPS",
                      help="write a jax.profiler trace of learner steps to RUN_DIR/profile/"
                      "learner, and of the sampler processes' engine steps meanwhile to "
                      "RUN_DIR/profile/sampler: N traces the N steps after this launch's "
                      "first (which compiles), A:B steps A to B-1; view with tensorboard "
                      "--logdir RUN_DIR/profile or in https://ui.perfetto.dev")
  parser.add_argument("--plot", metavar="RUN_DIR", help="only redraw the curves of a run")
  return parser


def check(cfg) -> str:
  """`--check`'s output: the resolved config (run paths filled in) as JSON."""
  return json.dumps(dataclasses.asdict(cfg.with_run_paths()), indent=2)


def done_line(summary: dict, eval_every: int) -> str:
  """The run's last word: steps done, why it stopped, and the held-out accuracy of its
  last evaluation, or that none ran (not a NaN accuracy)."""
  line = f"done: {summary['steps_done']} steps ({summary['stopped_by']}); "
  if "eval/accuracy" in summary:
    return line + f"held-out accuracy {summary['eval/accuracy']:.3f}"
  why = ("run.eval_every=0" if not eval_every else
         f"run.eval_every={eval_every} and no evaluation fell in this launch's steps")
  return line + (f"no evaluation ran ({why}); evaluate a checkpoint with "
                 "sao-eval --config CONFIG [--step N]")


def main(argv: Sequence[str] | None = None) -> None:
  parser = build_parser()
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
    # Without counting devices (which would start the backend before train.run claims
    # its chips): run.device_split's shares and fixed mesh sizes (`startup`).
    cfg = startup.load(args.config, overrides,
                       lambda cfg: startup.train_sampler_meshes(cfg, None))
    startup.check_train_inputs(cfg.with_run_paths())
    profile = None
    if args.profile is not None:
      profile = ProfileSteps.parse(args.profile)
      profile.check(cfg.learner.steps)
    if args.check:
      print(check(cfg))
      warning = startup.no_policy_update(cfg)
      if warning:
        print(f"sao-train: {warning}", file=sys.stderr)
      print(f"sao-train: {args.config} is valid", file=sys.stderr)
      return
    # After argument errors: importing JAX (with sao_jax.jobs.train) takes seconds.
    from sao_jax.jobs import train

    summary = train.run(cfg, resume=None, profile=profile,
                        log=lambda line: print(line, flush=True))
  except (ValueError, FileNotFoundError) as error:
    parser.exit(2, f"error: {error}\n")
  print(done_line(summary, cfg.run.eval_every))
  print(f"run directory: {cfg.run.run_dir}  (metrics.jsonl, tensorboard/, checkpoints/)")
  print(f"plot: {summary['plot']}")


if __name__ == "__main__":
  main(sys.argv[1:])
