"""The main job: warm-start, then SAO (or a baseline) with asynchronous samplers.

    run(cfg, resume=True)   # what `sao-train --config FILE` calls

1. Run directory: the resolved config (`config.json`; its model section filled
   from the checkpoint `run.init` names, `sao_jax.config.init_model`, and
   printed), the tokenizer, logs.
2. Initial policy: random, a Hugging Face directory or a sao_jax params
   directory (`run.init`); the critic copies its trunk with a fresh head.
3. Optional SFT warm-start (`run.sft_steps`) on the environment's
   demonstrations, ended early once validation accuracy reaches
   `run.sft_target_accuracy` (`sft_warm_start`); skipped when resuming.
4. Samplers: `run.num_samplers` processes (spawn) generate continuously with the
   newest published weights and stream trajectories through the transport; the
   learner's grain pipeline filters stale/malformed ones and batches the rest.
   With `data.fixed_lag` batches follow a schedule instead (`sao_jax.data.fixed_lag`:
   batch t by task position, sampled by the policy after t - L steps), so one seed's
   run repeats on a loaded machine; a dead sampler then ends the run.
   With `run.num_samplers=0` the samplers run elsewhere (`sao-sampler`, e.g. on
   another slice) and write to the directory transport. `run.device_split`
   splits this host's devices between the learner (its mesh) and each sampler
   process (started seeing only its own), checked before anything compiles
   (`local_devices`, `sao_jax.sharding.device_split`); on a TPU host it is made
   before the backend starts (`claim_tpu_chips`), libtpu holding every chip it may.
   Multi-host learner (SAO_* environment, `sao_jax.sharding.distributed`): every host
   builds the pipeline for its share of each batch (`local_batch_sizes`) and
   reads a disjoint part of the directory transport (`DirectoryTransport` shard
   = (process index, process count)); `run_learner` assembles the global batch.
5. Learner loop (`learner.loop.run_learner`): value-only steps first (value
   pretraining, critic warm-up), then SAO steps; after each step the policy is
   published when its version changed, dead samplers are restarted, and every
   `run.eval_every` steps the held-out set is evaluated. A run that cannot change
   the policy says so: at start-up when its steps end inside the critic's warm-up
   (`startup.no_policy_update`), and when the policy's gradient has been exactly 0
   for a few steps in a row, with the cause (`sao_jax.run.zero_gradient`).
6. Outputs: a progress line per step, `metrics.jsonl`, TensorBoard events,
   orbax checkpoints (`checkpoint.directory`, default RUN_DIR/checkpoints) and
   `curves.png` at the end, and the first and the last training batch's first
   episodes as text (`train_transcripts`). A resumed (or restarted) run replaces the rows of
   the steps it trains again (`MetricsLogger.rewind`), so each step is logged once.
   `run.run_dir` may be a bucket URL: what lives there and what is refused is
   `sao_jax.storage`'s list.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os

import jax

from sao_jax.channel import run_secret
from sao_jax.channel import weights
from sao_jax.channel.published import published_template, published_weights
from sao_jax.config import Config, init_model
from sao_jax.config.run import RESUME_IDENTITY, RESUME_MAY_CHANGE
from sao_jax.config.versions import as_this_version
from sao_jax.data import failures, fixed_lag, pipeline
from sao_jax.data.learner_data import (Checkpointed, learner_batches, learner_transport,
                                       local_batch_sizes)
from sao_jax.data.task_positions import TaskPositions
from sao_jax.envs.registry import make_env
from sao_jax.envs.sandbox import IsolationUnavailable
from sao_jax.jobs import startup, train_transcripts, warm_start
from sao_jax.jobs.evaluate import Evaluator, transcripts_path
from sao_jax.learner import compile as compile_lib
from sao_jax.learner.loop import run_learner
from sao_jax.learner.state import policy_weights, state_from_params
from sao_jax.learner.step import value_only_steps
from sao_jax.models.value import value_params_from_policy
from sao_jax.run import bootstrap
from sao_jax.run import lock as run_lock
from sao_jax.run.critic_window import CriticWindow
from sao_jax.run.metrics import MetricsLogger, batch_metrics, plot_curves, read_metrics
from sao_jax.run.checkpoint import PreemptionWatcher
from sao_jax.run.phases import StepPhases
from sao_jax.run.profile import SAMPLER_WRITE_S, LearnerProfiler, ProfileSignal, ProfileSteps
from sao_jax.run.timing import RunClock
from sao_jax.run.waiting import WaitingReporter
from sao_jax.run.zero_gradient import ZeroGradientWatch
from sao_jax.sampler.worker import START_METHOD, SamplerSupervisor, WorkerSpec
from sao_jax.sharding import device_split, distributed
from sao_jax.sharding.mesh import make_mesh
from sao_jax import storage
from sao_jax.storage import storage_path


def checkpoint_directory(cfg: Config):
  """The run's checkpoint directory (a path, or an epath.Path in a bucket) and whether it
  holds any checkpoint yet."""
  checkpoints = storage_path(cfg.with_run_paths().checkpoint.directory)
  # Orbax names a finished step's directory by the step; a save killed midway leaves
  # only a `<step>.orbax-checkpoint-tmp-*` directory, which holds no checkpoint.
  return checkpoints, checkpoints.is_dir() and any(
      str(p).rstrip("/").rpartition("/")[2].isdigit() for p in checkpoints.iterdir())


def resume_differences(saved: dict, cfg: Config) -> list[str]:
  """The `run.RESUME_IDENTITY` fields in which `saved` (a config as a checkpoint
  stores it, JSON) and `cfg` differ, as "field: checkpoint X, now Y" lines."""
  current = json.loads(json.dumps(dataclasses.asdict(cfg)))  # tuples as the JSON lists saved
  saved = as_this_version(saved, cfg)  # fields added or removed since it was saved
  differences = []

  def compare(path: str, a, b):
    if path in RESUME_MAY_CHANGE:
      return
    if isinstance(a, dict) and isinstance(b, dict):
      for key in sorted(set(a) | set(b)):
        compare(f"{path}.{key}", a.get(key, "<missing>"), b.get(key, "<missing>"))
    elif a != b:
      differences.append(f"{path}: checkpoint {a!r}, now {b!r}")

  for path in RESUME_IDENTITY:
    section, _, field = path.partition(".")
    saved_value, current_value = saved.get(section, "<missing>"), current[section]
    if field:
      saved_value = saved_value.get(field, "<missing>") if isinstance(saved_value, dict) else (
          "<missing>")
      current_value = current_value[field]
    compare(path, saved_value, current_value)
  return differences


def resume_decision(cfg: Config, log=print) -> bool:
  """Whether this launch resumes, as `run.resume` says (`config.run.RESUME_MODES`);
  ValueError when it may not start: checkpoints there under "never", or of another
  run under "auto". Says so when a resuming launch finds no checkpoint, so a
  typo'd run directory is not silently a new run. Only reads the checkpoint
  directory (a read-only `Checkpointer`); `run` asks after taking the run lock."""
  checkpoints, held = checkpoint_directory(cfg)
  mode = cfg.run.resume
  if not held:
    if mode != "never":
      log(f"sao-train: run.resume={mode!r} found no checkpoint in {checkpoints}; starting "
          "from step 0")
    return False
  if mode == "never":
    raise ValueError(f"{checkpoints} already holds checkpoints; pass --resume auto to continue "
                     "that run (refused if its config differs), --resume to continue it with "
                     "this config whatever changed, or set run.run_dir=ANOTHER_DIR")
  if mode == "auto":
    from sao_jax.run.checkpoint import Checkpointer  # pylint: disable=import-outside-toplevel
    checkpointer = Checkpointer(cfg.with_run_paths())  # read-only: it only reads the config
    try:
      saved = checkpointer.saved_config()
    finally:
      checkpointer.close()
    differences = resume_differences(saved or {}, cfg) if saved is not None else []
    if differences:
      raise ValueError(
          f"run.resume='auto': {checkpoints} holds checkpoints of another config ("
          + "; ".join(differences[:8]) + (f"; and {len(differences) - 8} more"
                                           if len(differences) > 8 else "")
          + "). Relaunch with the config that run was started with, pass --resume to "
          "continue it with this config anyway, or set run.run_dir=ANOTHER_DIR")
  return True


def rl_gain(run_dir) -> dict[str, float]:
  """Held-out accuracy at RL step 0 (after any warm-start), at the last evaluation,
  and their difference: what the RL phase itself gained. Read from metrics.jsonl,
  so a resumed run reports it too; empty without evaluations at and after step 0."""
  rows = [row for row in read_metrics(run_dir) if "eval/accuracy" in row and row["step"] >= 0]
  if not rows or rows[0]["step"] != 0:
    return {}
  start, final = rows[0], rows[-1]
  gain = {"eval/accuracy_after_sft": start["eval/accuracy"],
          "eval/accuracy_after_rl": final["eval/accuracy"],
          "eval/rl_gain": final["eval/accuracy"] - start["eval/accuracy"]}
  if "eval/sampled_accuracy" in start and "eval/sampled_accuracy" in final:
    gain.update({"eval/sampled_accuracy_after_sft": start["eval/sampled_accuracy"],
                 "eval/sampled_accuracy_after_rl": final["eval/sampled_accuracy"],
                 "eval/sampled_rl_gain": (final["eval/sampled_accuracy"]
                                          - start["eval/sampled_accuracy"])})
  return gain


def rl_gain_line(summary: dict, episodes: int, temperature: float, *, sft_steps: int) -> str:
  """The run's closing line: held-out greedy accuracy at RL step 0 ("after SFT", or
  "before RL" for a run without an SFT warm-start, `sft_steps` 0) and after RL, and,
  when the run evaluated sampled episodes too, the sampled accuracy (RL's honest gain:
  greedy accuracy can flip from 0 to 1 on one opening token's argmax)."""
  start = "after SFT" if sft_steps > 0 else "before RL"
  line = (f"held-out accuracy ({episodes} episodes): greedy {start} "
          f"{summary['eval/accuracy_after_sft']:.3f}, after RL "
          f"{summary['eval/accuracy_after_rl']:.3f}, RL gain {summary['eval/rl_gain']:+.3f}")
  if "eval/sampled_rl_gain" in summary:
    line += (f"; sampled (temperature {temperature:g}) {start} "
             f"{summary['eval/sampled_accuracy_after_sft']:.3f}, after RL "
             f"{summary['eval/sampled_accuracy_after_rl']:.3f}, RL gain "
             f"{summary['eval/sampled_rl_gain']:+.3f}")
  return line


def run(cfg: Config, *, resume: bool | None = True, log=print,
        profile: ProfileSteps | None = None) -> dict:
  """Trains as configured; returns the final summary (also in RUN_DIR/summary.json).

  `resume`: True continues from the newest checkpoint there is (else step 0),
  False starts at step 0; None decides by `run.resume` (`resume_decision`), what
  `sao-train` does. `profile`: the learner steps to trace, with the samplers' engine
  steps meanwhile (`sao-train --profile`, `sao_jax.run.profile`)."""
  # On a TPU host this process's chips are claimed first: libtpu reads their variables
  # once, when the backend starts, and then holds every chip it was allowed.
  tpu_sampler_envs = claim_tpu_chips(cfg)
  distributed.initialize()  # a multi-host learner: join the cluster the environment names
  # Refused before any directory is made, sampler started or program compiled. The
  # chips are claimed and the cluster joined, so the host's devices may be counted.
  cfg = startup.check(init_model.resolve(cfg.with_run_paths()),
                      lambda cfg: startup.train_sampler_meshes(cfg, jax.local_device_count()))
  startup.check_train_inputs(cfg)
  init_model.check_dtypes(cfg.model, jax.devices())
  shared_run_dir(cfg)
  learner_devices, sampler_envs = local_devices(cfg, tpu_sampler_envs)
  run_dir = storage.as_path(cfg.run.run_dir)  # a bucket URL: an epath (sao_jax.storage)
  try:
    if not storage.is_url(cfg.run.run_dir):  # a bucket's object names make its directories
      run_dir.mkdir(parents=True, exist_ok=True)
  except OSError as error:  # a file there or in its parents, no permission, a full disk
    raise ValueError(f"run.run_dir={cfg.run.run_dir!r} cannot be created as a directory "
                     f"({error.strerror or error}); set --set run.run_dir=ANOTHER_DIR") from error
  # Held before anything looks into the run directory: a launch refused here has
  # created, deleted and renamed nothing of the learner running there (`run.lock`).
  lock = run_lock.hold(cfg.run.run_dir, jax.process_index())
  try:
    if resume is None:
      resume = resume_decision(cfg, log)
    return _run(cfg, run_dir, resume=resume, log=log, learner_devices=learner_devices,
                sampler_envs=sampler_envs, profile=profile)
  finally:
    lock.close()


def sampler_status(cfg: Config, supervisor: SamplerSupervisor, batches=None) -> str:
  """How the samplers stand, for the learner's waiting reports (with `data.fixed_lag`, what
  the scheduled `batches` wait for)."""
  if not cfg.run.num_samplers:
    return "samplers run elsewhere (run.num_samplers=0: sao-sampler writes to the transport)"
  status = (f"{len(supervisor.pids())} of {cfg.run.num_samplers} sampler processes alive, "
            f"{supervisor.restarts} restarts")
  if isinstance(batches, fixed_lag.ScheduledBatches):
    status += f"; {batches.status()}"
  return status


def sampler_starts(cfg: Config, positions: TaskPositions, batches) -> dict:
  """`SamplerSupervisor`'s `task_start` and `no_restart`: by default a (re)started worker
  goes on after the tasks that reached the learner; with `data.fixed_lag` a worker starts
  at the batch the learner waits for (`batches()`, the `fixed_lag.ScheduledBatches`, read
  when the samplers start) and a dead one ends the run."""
  if cfg.data.fixed_lag is None:
    return {"task_start": positions.start}
  return {"task_start": lambda worker_id: batches().schedule.task_start(batches().next_batch),
          "no_restart": fixed_lag.NO_RESTART}


def shared_run_dir(cfg: Config) -> None:
  """ValueError for a bucket `run.run_dir` of a learner on several hosts: each host
  writes its own metrics.jsonl, config.json and summary.json (its own share of the
  batch metrics), which on one bucket would overwrite each other's; on local disks
  each host keeps its own."""
  if storage.is_url(cfg.run.run_dir) and jax.process_count() > 1:
    raise ValueError(f"run.run_dir={cfg.run.run_dir!r} is a bucket, which the "
                     f"{jax.process_count()} hosts of this learner would share, and each writes "
                     "its own metrics.jsonl there; set run.run_dir to a local directory and "
                     "keep checkpoint.directory in the bucket")


def one_host(cfg: Config, hosts: str) -> ValueError:
  """The refusal of `run.device_split` for a learner on several hosts (`hosts` says why
  it is)."""
  return ValueError(f"run.device_split={cfg.run.device_split} splits one host's devices, and "
                    f"{hosts}; set run.device_split=[] and run the samplers on their own hosts "
                    "(sao-sampler)")


def claim_tpu_chips(cfg: Config) -> list[dict[str, str]] | None:
  """On a TPU host with `run.device_split`, this (the learner's) process's chip
  variables set in os.environ, and each local sampler process's returned
  (`device_split.tpu_plan`); None where the split is made after the backend starts
  (`local_devices`: no split, or not a TPU host). Starts no backend, so it must run
  before anything does (`jax.distributed`, `jax.devices()`); ValueError when the split
  cannot be made."""
  if not cfg.run.device_split:
    return None
  chips = device_split.host_tpu_chips()
  if not chips:
    return None
  address = os.environ.get(distributed.ENV_ADDRESS)
  if address:  # jax.process_count() would start the backend: the environment says it all
    raise one_host(cfg, f"{distributed.ENV_ADDRESS}={address!r} makes this learner a cluster "
                        "of hosts")
  envs = device_split.tpu_plan(cfg.run.device_split, chips, os.environ,
                               device_split.two_device_chips())
  os.environ.update(envs[0])
  return envs[1:]


def local_devices(cfg: Config, tpu_sampler_envs: list[dict[str, str]] | None = None
                  ) -> tuple[list[jax.Device] | None, list[dict[str, str]]]:
  """(the learner's devices, each local sampler process's environment) under
  `run.device_split` (`sao_jax.sharding.device_split`), checked against this host's
  devices before anything compiles; without a split, (None: all devices, no
  variables). On a TPU host `claim_tpu_chips` made the split before the backend
  started (`tpu_sampler_envs`): the learner's devices are all this process opened,
  which must be its share."""
  if not cfg.run.device_split:
    return None, [{} for _ in range(cfg.run.num_samplers)]
  if jax.process_count() > 1:
    raise one_host(cfg, f"this learner spans {jax.process_count()} hosts")
  if tpu_sampler_envs is None:
    return device_split.local_plan(cfg.run.device_split, jax.local_devices(), os.environ)
  devices = jax.local_devices()
  if devices[0].platform != "tpu":  # /dev/vfio groups of some other device, say
    raise ValueError(
        f"run.device_split={cfg.run.device_split}: this host was taken for a TPU host "
        "(entries under /dev/accel<n> or /dev/vfio), but JAX opened "
        f"{devices[0].platform} devices; start sao-train with "
        f"JAX_PLATFORMS={devices[0].platform} so the split is made over those")
  if len(devices) != cfg.run.device_split[0]:
    raise ValueError(
        f"run.device_split={cfg.run.device_split}: the learner opened {len(devices)} TPU "
        f"devices under TPU_VISIBLE_CHIPS={os.environ.get('TPU_VISIBLE_CHIPS')!r}, not its "
        f"{cfg.run.device_split[0]}: the backend started before the split set its variables, "
        "or the runtime ignored them; set run.device_split=[] and run the samplers on other "
        "hosts (sao-sampler)")
  return devices, tpu_sampler_envs


def _run(cfg: Config, run_dir, *, resume: bool, log,
         learner_devices: list[jax.Device] | None, sampler_envs: list[dict[str, str]],
         profile: ProfileSteps | None) -> dict:
  if jax.process_count() > 1 and cfg.run.eval_every:
    raise ValueError(f"run.eval_every={cfg.run.eval_every}: in-run evaluation needs the whole "
                     f"policy on one host, and this learner spans {jax.process_count()} hosts; "
                     "set run.eval_every=0 and evaluate checkpoints with sao-eval")
  if jax.process_count() > 1 and cfg.run.sft_target_accuracy:  # validate: sft_steps > 0
    raise ValueError(f"run.sft_target_accuracy={cfg.run.sft_target_accuracy}: checking it "
                     "needs the whole policy on one host; warm-start on one host "
                     "(python -m experiments.warm_start) and start this run from it (run.init)")
  local_batch_sizes(cfg, jax.process_count())  # refuse a batch the hosts cannot share, early
  # --profile: the learner opens and closes the trace window of its sampler processes.
  signal, profiler = None, None
  if profile is not None:
    profile.check(cfg.learner.steps)
    if cfg.run.num_samplers:
      signal = ProfileSignal.make(cfg.run.run_dir, multiprocessing.get_context(START_METHOD))
    profiler = LearnerProfiler(profile, cfg.run.run_dir, signal, log)
  # An environment whose tools cannot be isolated here refuses now (IsolationUnavailable,
  # saying how to get it), not later in every sampler until they run out of restarts.
  try:
    make_env(cfg.env).close()
  except IsolationUnavailable as error:
    raise ValueError(f"env.sandbox={cfg.env.sandbox!r}: {error}") from None
  storage.write_atomic(run_dir / "config.json",
                       json.dumps(dataclasses.asdict(cfg), indent=2).encode())
  source = "random init" if cfg.run.init == "random" else f"run.init={cfg.run.init}"
  log(f"model section ({source}; saved in {run_dir / 'config.json'}): "
      f"{init_model.describe(cfg.model)}")
  warning = startup.no_policy_update(cfg)
  if warning:
    log(warning)
  chat = bootstrap.prepare_chat(cfg, log)
  logger = MetricsLogger(run_dir, total_steps=cfg.learner.steps, loggers=cfg.run.loggers,
                         wandb_project=cfg.run.wandb_project, name=cfg.name,
                         config=dataclasses.asdict(cfg))
  evaluator = None

  def initial_state(mesh):
    logger.rewind(None)  # a fresh start: rows of an attempt killed before its first checkpoint go
    policy = bootstrap.initial_policy(cfg)
    if cfg.run.sft_steps:
      if cfg.run.eval_every:  # the starting point, so the warm-start's effect is measured
        evaluate(-cfg.run.sft_steps, policy, 0)
      policy, _ = warm_start.sft_warm_start(
          cfg, chat, policy, bootstrap.demonstrations(cfg, chat), log=log,
          log_metrics=lambda step, m: logger.write(step - cfg.run.sft_steps, m))
    return state_around(mesh, policy)

  def state_around(mesh, policy):
    state = state_from_params(cfg, policy, value_params_from_policy(policy, cfg.model))
    if jax.process_count() > 1:  # every host holds the same full state on its own device;
      state = jax.device_get(state)  # from host memory, each places the shards it holds
    return jax.device_put(state, compile_lib.state_shardings(cfg, mesh))

  def base_state(mesh):  # a LoRA resume's frozen base: run.init again (no SFT with LoRA)
    return state_around(mesh, bootstrap.initial_policy(cfg))

  # One secret seals the transport directory and signs the weights directory.
  secret = run_secret.for_run(cfg.sampler)
  # LoRA: the channel carries only the adapters; samplers load the base once.
  publisher = weights.make_publisher(cfg.sampler, published_template(
      cfg, jax.eval_shape(lambda: bootstrap.initial_policy(cfg))), secret)
  drops = pipeline.Drops()
  # Every trajectory admission judges; its bound stops a run whose episodes all fail.
  intake = failures.Intake(drops, max_fraction=cfg.run.max_failure_fraction,
                           window=cfg.run.failure_window)
  transport = learner_transport(cfg, drops, secret)
  # The tasks whose episodes reached the learner, per sampler worker: a restarted
  # sampler goes on with its task stream from there (checkpointed with the pipeline).
  positions = TaskPositions()
  supervisor = SamplerSupervisor(
      [WorkerSpec(cfg=cfg, tokenizer_path=cfg.run.tokenizer_file, weights=publisher.spec,
                  transport=transport, worker_id=i, env=tuple(sorted(sampler_envs[i].items())),
                  profile=signal)
       for i in range(cfg.run.num_samplers)],
      log=log, **sampler_starts(cfg, positions, lambda: batches))
  reporter = WaitingReporter(intake, batch_size=local_batch_sizes(cfg, jax.process_count())[0],
                             samplers=lambda: sampler_status(cfg, supervisor, batches), log=log,
                             every_s=cfg.run.waiting_report_s)
  published = {"version": -1}
  # Waiting for trajectories, the learner restarts samplers that died: one that died
  # before the first step would otherwise leave it waiting forever. A SIGTERM ends the
  # wait (an agent episode may take minutes; a preempted TPU VM has seconds).
  watcher = PreemptionWatcher()
  batches = learner_batches(cfg, transport, current_version=lambda: published["version"],
                            drops=drops, intake=intake, while_waiting=supervisor.check,
                            on_poll=reporter.poll, interrupted=lambda: watcher.requested,
                            positions=positions)
  # Weight-channel connection errors by reason (a network publisher counts them).
  peer_errors = getattr(publisher, "stats", {})
  # Padding share per batch: what bucketing wastes and packing (learner.batch_tokens) saves.
  # The learner step each batch is for (set by on_start): the first and the last
  # batch's episodes are written as text (`train_transcripts`).
  batch_step = {"next": 0}

  def with_metrics(item):
    step, batch_step["next"] = batch_step["next"], batch_step["next"] + 1
    if step in train_transcripts.transcript_steps(cfg):
      train_transcripts.write_batch_transcripts(
          train_transcripts.train_transcripts_path(cfg, step), item[0], chat, step)
    return item[0], {
        **batch_metrics(item[1], drops), "batch/padding_frac": item[1].padding_fraction,
        "episodes/failed_frac": intake.failed_fraction,
        **{f"weights/errors/{k}": float(v) for k, v in peer_errors.items()}}

  with_host_metrics = Checkpointed(batches, with_metrics)
  summary: dict = {}

  def publish(state, force=False):
    version = int(jax.device_get(state.policy_version))
    if force or version != published["version"]:
      # Copies what it keeps: state is donated.
      publisher.publish(published_weights(cfg, state), version)
      published["version"] = version
    return version

  def evaluate(step, policy, version):
    nonlocal evaluator
    params = jax.device_get(policy)
    if evaluator is None:
      evaluator = Evaluator(cfg, chat, params, version=version)
    result = evaluator.evaluate(params, version, transcripts=transcripts_path(cfg, step))
    logger.write(step, result)
    summary.update(result)
    log(f"eval @ step {step}: accuracy {result['eval/accuracy']:.3f} "
        f"(tool-call rate {result['eval/tool_call_rate']:.2f})")

  # Where each step's time goes (`run.phases`): the loop times its phases, these ours.
  phases = StepPhases()

  def after_step(steps_done, state):
    with phases.timed("publish"):
      version = publish(state)
    if cfg.data.fixed_lag is not None:  # the samplers wait for the schedule's version
      fixed_lag.check_version(batches.schedule, steps_done, version)
    supervisor.check()
    if cfg.run.eval_every and steps_done % cfg.run.eval_every == 0:
      with phases.timed("eval"):
        evaluate(steps_done, policy_weights(cfg, state), version)
    if profiler is not None:
      with phases.timed("profile"):
        profiler.at(steps_done)
    reporter.stepped(steps_done)  # from here on the learner waits for the next batch

  reported_drops: set[str] = set()
  zero_gradient = ZeroGradientWatch(
      value_only_steps=value_only_steps(cfg.learner, cfg.algorithm), total_steps=cfg.learner.steps)
  critic_window = CriticWindow()

  def on_metrics(step, metrics):
    metrics = {**metrics, **critic_window.update(metrics)}  # pooled over the last steps
    logger.write(step, metrics)
    log(logger.progress(step, metrics))
    warning = zero_gradient.observe(step, metrics)
    if warning:
      log(warning)
    for reason in sorted(set(drops) - reported_drops):  # say once why data is being dropped
      reported_drops.add(reason)
      log(f"dropping trajectories: {reason} (first: {drops.examples.get(reason, '-')})")

  def on_start(state, resumed):
    if resumed:  # the steps after the checkpoint are trained and logged again
      step = int(jax.device_get(state.step))
      logger.rewind(step)
      log(f"resuming from step {step} (the newest checkpoint in {cfg.checkpoint.directory})")
    if cfg.run.eval_every and not resumed:
      evaluate(0, policy_weights(cfg, state), 0)
    publish(state, force=True)
    supervisor.start()
    batch_step["next"] = int(jax.device_get(state.step))
    if profiler is not None:  # a window that starts at this launch's first step
      profiler.at(batch_step["next"])
    reporter.stepped(batch_step["next"])

  try:
    result = run_learner(cfg, with_host_metrics, on_metrics=on_metrics, after_step=after_step,
                         on_start=on_start, resume=resume, initial_state=initial_state,
                         base_state=base_state, log=log,
                         # A resumed run's clock goes on from its last kept row (rewind).
                         clock=lambda: RunClock(**logger.carried), phases=phases,
                         watcher=watcher, mesh=make_mesh(cfg.mesh, learner_devices) if learner_devices else None)
  except failures.TooManyFailures as error:  # the run's account, then the error (exit 2)
    summary.update({"stopped_by": "too_many_failures", "error": str(error), **intake.summary()})
    storage.write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2).encode())
    raise
  finally:
    watcher.close()
    if profiler is not None:  # a run that ended inside the window still writes its trace
      profiler.close()
    transport.close()
    if profiler is None:
      supervisor.stop()
    else:  # a sampler still writing its trace is given the time to finish it
      supervisor.stop(timeout=SAMPLER_WRITE_S)
    publisher.close()
    logger.close()
  log(intake.closing_line())
  summary.update({"steps_done": result.steps_done, "stopped_by": result.stopped_by,
                  **intake.summary(), "weight_channel_errors": dict(peer_errors),
                  "sampler_restarts": supervisor.restarts,
                  "plot": str(plot_curves(run_dir))})
  summary.update(rl_gain(run_dir))
  if "eval/rl_gain" in summary:
    log(rl_gain_line(summary, cfg.run.eval_episodes, cfg.run.eval_temperature,
                     sft_steps=cfg.run.sft_steps))
  storage.write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2).encode())
  return summary
