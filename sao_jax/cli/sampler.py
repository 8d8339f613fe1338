"""`sao-sampler`: sampler workers for a learner that runs elsewhere (another slice).

  sao-sampler --config FILE [--set section.field=value ...] [--workers N] [--first-worker K]

Reads the same config file as the learner's `sao-train` (with `run.num_samplers=0`
there) and runs `--workers` sampler processes (`sao_jax.sampler.worker`, restarted
if they die) on this host. They adopt weights from the channel `sampler.weights`
names: "network" (the learner hosts' `sampler.weights_addresses`) or "directory"
(`sampler.weights_dir`); and write trajectories to `data.transport_dir`, a
directory the learner hosts share (`data.transport='directory'`). The tokenizer
is `run.tokenizer`, else RUN_DIR/tokenizer.json as the learner wrote it (waited
for). Worker ids seed the episodes: give each sampler host its own range with
`--first-worker`, or all hosts generate the same episodes.

It exits when the learner closes the transport (the run ended) or on SIGTERM /
Ctrl-C. A close marker left by a previous run is waited out: the learner removes
it when it starts.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys
import threading
import time
from typing import Sequence

from sao_jax.config import Config, load_config


def check_remote(cfg: Config) -> None:
  """ValueError unless the learner can be reached from another host: trajectories
  through a shared directory, weights over the network or a shared directory."""
  if cfg.data.transport != "directory":
    raise ValueError(f"data.transport={cfg.data.transport!r}: sao-sampler writes trajectories "
                     "to a directory the learner reads; set data.transport='directory' and "
                     "data.transport_dir (the same on both sides)")
  if cfg.sampler.weights == "shared_memory":
    raise ValueError("sampler.weights='shared_memory' only reaches samplers the learner "
                     "started; set sampler.weights='network' (with weights_addresses) or "
                     "'directory'")
  if cfg.sampler.weights == "network" and not cfg.sampler.weights_addresses:
    raise ValueError("sampler.weights='network' needs sampler.weights_addresses: the "
                     "host:port of every learner host, in process order")


def _wait_for(what: str, ready, stop: threading.Event, log) -> bool:
  """Waits until `ready()` (logging once what for); False if stopped first."""
  if not ready():
    log(f"waiting for {what}")
  while not ready():
    if stop.wait(0.5):
      return False
  return True


def run(cfg: Config, *, workers: int = 1, first_worker: int = 0, log=print,
        stop: threading.Event | None = None) -> int:
  """Runs the sampler workers until the learner closes the transport or `stop` is
  set; returns how many times a worker was restarted."""
  from sao_jax.checkpoint import storage_path
  from sao_jax.data.transport import DirectoryTransport
  from sao_jax.models.transformer import abstract_params
  from sao_jax.sampler import weights, weights_net, weights_wire
  from sao_jax.sampler.worker import SamplerSupervisor, WorkerSpec

  stop = stop or threading.Event()
  tokenizer = pathlib.Path(cfg.run.tokenizer or pathlib.Path(cfg.run.run_dir) / "tokenizer.json")
  transport = DirectoryTransport(cfg.data.transport_dir, cfg.data.transport_capacity,
                                 max_tokens=cfg.sampler.max_seq_len)
  if not (_wait_for(f"the tokenizer {tokenizer} (the learner writes it)", tokenizer.exists,
                    stop, log)
          and _wait_for(f"the learner to reopen {transport.directory} (a previous run closed "
                        "it)", lambda: not transport.closed, stop, log)):
    return 0
  template = abstract_params(cfg.model, "lm")  # what the learner publishes: the policy
  if cfg.sampler.weights == "network":
    spec = weights_net.NetworkSpec(tuple(cfg.sampler.weights_addresses), template,
                                   secret=weights_wire.load_secret(cfg.sampler))
  else:
    spec = weights.DirectorySpec(str(storage_path(cfg.sampler.weights_dir)), template)
  supervisor = SamplerSupervisor(
      [WorkerSpec(cfg=cfg, tokenizer_path=str(tokenizer), weights=spec, transport=transport,
                  worker_id=first_worker + i) for i in range(workers)], log=log)
  supervisor.start()
  log(f"started {workers} sampler worker(s), writing to {transport.directory}")
  try:
    # Read `closed` before `check()`: a worker that just saw the close exits, and
    # must not be restarted.
    while not transport.closed and not stop.wait(1.0):
      supervisor.check()
  finally:
    supervisor.stop()
  log("the learner closed the transport" if transport.closed else "stopped")
  return supervisor.restarts


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="sao-sampler", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="the learner's configs/<name>.py file")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="SECTION.FIELD=VALUE", help="override a config field (repeatable)")
  parser.add_argument("--workers", type=int, default=1,
                      help="sampler processes on this host (default 1)")
  parser.add_argument("--first-worker", type=int, default=0,
                      help="id of this host's first worker; ids seed the episodes")
  args = parser.parse_args(argv)
  if args.workers < 1 or args.first_worker < 0:
    parser.error(f"--workers={args.workers} must be >= 1 and --first-worker="
                 f"{args.first_worker} >= 0")
  import jax

  # This process only supervises (and traces the params' shapes): it must leave the
  # accelerator to the workers, fresh spawned interpreters that do not inherit this.
  jax.config.update("jax_platforms", "cpu")
  stop = threading.Event()
  signal.signal(signal.SIGTERM, lambda *_: stop.set())
  try:
    cfg = load_config(args.config, args.overrides)
    check_remote(cfg)
    run(cfg, workers=args.workers, first_worker=args.first_worker, stop=stop,
        log=lambda line: print(line, flush=True))
  except (ValueError, FileNotFoundError) as error:
    parser.exit(2, f"error: {error}\n")
  except KeyboardInterrupt:
    stop.set()


if __name__ == "__main__":
  main(sys.argv[1:])
