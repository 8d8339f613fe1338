"""Sampler workers for a learner that runs elsewhere (`sao-sampler`, another slice).

    run(cfg, workers=N, first_worker=K)

Reads the learner's config (`run.num_samplers=0` there) and runs `workers`
sampler processes (`sao_jax.sampler.worker`, restarted if they die) on this
host. They adopt weights from the channel `sampler.weights` names (the learner
hosts' network servers, or `sampler.weights_dir`) and write trajectories to
`data.transport_dir`, which the learner hosts share. The tokenizer is
`run.tokenizer_source` (waited for: the learner writes it). Worker ids seed the
episodes, so each sampler host takes its own range (`first_worker`).

Returns when the learner closes the transport (the run ended) or `stop` is set.
`profile` (`sao-sampler --profile`) has every worker trace those of its engine
steps to RUN_DIR/profile/sampler/worker_<id> on this host (`sao_jax.run.profile`).
`group` (`sao-sampler --coordinator`, an `engine_group.GroupSpec`) makes this
host's one worker a process of one engine over several hosts: process 0 leads
and writes the trajectories, the others replay its engine calls
(`sao_jax.sampler.multihost`); every host runs `sao-sampler` with the same
flags but its own `--process-id`.
Records and markers are sealed with the run secret (`sampler.weights_secret_file`
or `_env`, the learner's; `data.sealed`): the workers start once the learner has
started a run (a signed RUN marker), write for the newest run it started, and
a close marker an earlier run left, or one without the secret, stops nothing.
"""

from __future__ import annotations

import pathlib
import threading

from sao_jax.channel import run_secret
from sao_jax.channel import weights
from sao_jax.channel.published import published_template
from sao_jax.channel.transport import DirectoryTransport
from sao_jax.config import Config
from sao_jax.models.transformer import abstract_params
from sao_jax.run.profile import SAMPLER_WRITE_S, ProfileSignal, ProfileSteps
from sao_jax.sampler.engine_group import GroupSpec
from sao_jax.sampler.prompt_ids import MAX_WORKERS
from sao_jax.sampler.worker import SamplerSupervisor, WorkerSpec


def check_group(cfg: Config, group: GroupSpec, workers: int) -> None:
  """ValueError unless this host can be a process of one engine over several hosts."""
  group.validate()
  if workers != 1:
    raise ValueError(f"--workers={workers} with --coordinator: each host runs one process "
                     "of the engine group; run --workers=1 (its engine spans every host's "
                     "devices)")
  if not cfg.sampler.sharded:
    raise ValueError("--coordinator lays one engine over every host's devices, but "
                     "sampler.sharded=False runs it on one device; set sampler.sharded=true "
                     "(and sampler.mesh over all the group's devices)")


def _wait_for(what: str, ready, stop: threading.Event, log) -> bool:
  """Waits until `ready()` (logging once what for); False if stopped first."""
  if not ready():
    log(f"waiting for {what}")
  while not ready():
    if stop.wait(0.5):
      return False
  return True


def run(cfg: Config, *, workers: int = 1, first_worker: int = 0, log=print,
        stop: threading.Event | None = None, profile: ProfileSteps | None = None,
        group: GroupSpec | None = None) -> int:
  """Runs the sampler workers until the learner closes the transport or `stop` is
  set; returns how many times a worker was restarted."""
  if group is not None:
    check_group(cfg, group, workers)
  if workers < 1 or first_worker < 0:
    raise ValueError(f"--workers={workers} must be >= 1 and --first-worker={first_worker} >= 0")
  if first_worker + workers > MAX_WORKERS:
    raise ValueError(f"--first-worker={first_worker} --workers={workers} gives worker ids up to "
                     f"{first_worker + workers - 1}; GRPO group ids name at most {MAX_WORKERS} "
                     f"sampler workers (ids 0..{MAX_WORKERS - 1}) across all sampler hosts: "
                     "number the hosts' workers consecutively from 0")
  cfg.check_remote_samplers()
  window = None if profile is None else ProfileSignal.of_engine_steps(cfg.run.run_dir, profile)
  stop = stop or threading.Event()
  tokenizer = pathlib.Path(cfg.run.tokenizer_source)
  transport = DirectoryTransport(cfg.data.transport_dir, cfg.data.transport_capacity,
                                 max_tokens=cfg.sampler.max_seq_len,
                                 secret=run_secret.load_secret(cfg.sampler))
  if not (_wait_for(f"the tokenizer {tokenizer} (the learner writes it)", tokenizer.exists,
                    stop, log)
          and _wait_for(f"the learner to start a run in {transport.directory} (a RUN marker "
                        "signed with this secret, not yet closed)",
                        lambda: transport.running, stop, log)):
    return 0
  # What the learner publishes: the policy, or only its adapters under LoRA.
  spec = weights.remote_spec(cfg.sampler,
                             published_template(cfg, abstract_params(cfg.model, "lm")))
  supervisor = SamplerSupervisor(
      [WorkerSpec(cfg=cfg, tokenizer_path=str(tokenizer), weights=spec, transport=transport,
                  worker_id=first_worker + i, profile=window, group=group)
       for i in range(workers)], log=log)
  supervisor.start()
  log(f"started {workers} sampler worker(s), writing to {transport.directory}")
  try:
    # Read `closed` before `check()`: a worker that just saw the close exits, and
    # must not be restarted.
    while not transport.closed and not stop.wait(1.0):
      supervisor.check()
  finally:
    if window is None:
      supervisor.stop()
    else:  # a worker still writing its trace is given the time to finish it
      supervisor.stop(timeout=SAMPLER_WRITE_S)
  log("the learner closed the transport" if transport.closed else "stopped")
  return supervisor.restarts
