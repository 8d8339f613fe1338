"""`sao-sampler`: sampler workers for a learner that runs elsewhere (another slice).

  sao-sampler --config FILE [--set section.field=value ...] [--workers N] [--first-worker K]
  sao-sampler --config configs/demo_cpu.py --profile 20   # trace engine steps 1..20 of each worker
  sao-sampler --config configs/demo_cpu.py --coordinator 10.0.0.2:8476 --num-processes 2 --process-id 0
                                           # one engine over N hosts (run on each, I = 0..N-1)

Reads the same config file as the learner's `sao-train` (with `run.num_samplers=0`
there) and runs `--workers` sampler processes on this host until the learner
ends the run (`sao_jax.sampler.remote`). Weights come from `sampler.weights`
("network": the learner hosts' `sampler.weights_addresses`, or "directory":
`sampler.weights_dir`); trajectories go to `data.transport_dir`, a directory the
learner hosts share. Give each sampler host its own `--first-worker` range:
worker ids seed the episodes. SIGTERM or Ctrl-C stops the workers.

With --coordinator the hosts' processes join one jax.distributed group and lay one
engine over all their devices (sampler.sharded, sampler.mesh): process 0 leads
and writes the trajectories, the others replay its engine calls
(docs/guides/multi-host.md).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Sequence

from sao_jax.cli import flags
from sao_jax.jobs import startup
from sao_jax.run.profile import ProfileSteps


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="sao-sampler", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="the learner's configs/<name>.py file")
  flags.add_set(parser, help="the learner's overrides, as given to sao-train (repeatable)")
  parser.add_argument("--workers", type=int, default=1,
                      help="sampler processes on this host (default 1)")
  parser.add_argument("--first-worker", type=int, default=0,
                      help="id of this host's first worker; ids seed the episodes")
  parser.add_argument("--profile", metavar="STEPS",
                      help="write a jax.profiler trace of each worker's engine steps to "
                      "RUN_DIR/profile/sampler/worker_<id> on this host: N traces the N "
                      "engine steps after the first (which compiles), A:B steps A to B-1")
  group = parser.add_argument_group("one engine over several hosts")
  group.add_argument("--coordinator", metavar="HOST:PORT",
                     help="process 0's host and a free port, the same on every host")
  group.add_argument("--num-processes", type=int, help="hosts in the engine group")
  group.add_argument("--process-id", type=int, help="this host's index, 0 (the leader) to N-1")
  return parser


def engine_group(args: argparse.Namespace):
  """The GroupSpec the flags name, or None; ValueError naming a missing flag."""
  given = {"--coordinator": args.coordinator, "--num-processes": args.num_processes,
           "--process-id": args.process_id}
  if all(value is None for value in given.values()):
    return None
  missing = [flag for flag, value in given.items() if value is None]
  if missing:
    raise ValueError(f"one engine over several hosts needs --coordinator, --num-processes "
                     f"and --process-id together; missing {', '.join(missing)}")
  from sao_jax.sampler.engine_group import GroupSpec

  return GroupSpec(args.coordinator, args.num_processes, args.process_id).validate()


def main(argv: Sequence[str] | None = None) -> None:
  parser = build_parser()
  args = parser.parse_args(argv)
  import jax

  # This process only supervises (and traces the params' shapes): it must leave the
  # accelerator to the workers, fresh spawned interpreters that do not inherit this.
  jax.config.update("jax_platforms", "cpu")
  stop = threading.Event()
  signal.signal(signal.SIGTERM, lambda *_: stop.set())
  try:
    # The workers open this host's devices, which this process does not count: only
    # a sampler mesh with fixed data and fsdp sizes is checked against the pool here.
    profile = None if args.profile is None else ProfileSteps.parse(args.profile, "engine steps")
    group = engine_group(args)
    cfg = startup.load(args.config, args.overrides,
                       lambda cfg: startup.sampler_meshes(cfg, [None] * args.workers))
    from sao_jax.sampler import remote

    remote.run(cfg, workers=args.workers, first_worker=args.first_worker, stop=stop,
               log=lambda line: print(line, flush=True), profile=profile, group=group)
  except (ValueError, FileNotFoundError) as error:
    parser.exit(2, f"error: {error}\n")
  except KeyboardInterrupt:
    stop.set()


if __name__ == "__main__":
  main(sys.argv[1:])
