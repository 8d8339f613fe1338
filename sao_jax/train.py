"""The main job: warm-start, then SAO (or a baseline) with asynchronous samplers.

    run(cfg, resume=True)   # what `sao-train --config FILE` calls

1. Run directory: the resolved config (`config.json`), the tokenizer, logs.
2. Initial policy: random, a Hugging Face directory or a sao_jax params
   directory (`run.init`); the critic copies its trunk with a fresh head.
3. Optional SFT warm-start (`run.sft_steps`) on the environment's
   demonstrations, ended early once validation accuracy reaches
   `run.sft_target_accuracy` (`sft_warm_start`); skipped when resuming.
4. Samplers: `run.num_samplers` processes (spawn) generate continuously with the
   newest published weights and stream trajectories through the transport; the
   learner's grain pipeline filters stale/malformed ones and batches the rest.
   With `run.num_samplers=0` the samplers run elsewhere (`sao-sampler`, e.g. on
   another slice) and write to the directory transport.
   Multi-host learner (SAO_* environment, `sao_jax.distributed`): every host
   builds the pipeline for its share of each batch (`local_batch_sizes`) and
   reads a disjoint part of the directory transport (`DirectoryTransport` shard
   = (process index, process count)); `run_learner` assembles the global batch.
5. Learner loop (`learner.loop.run_learner`): value-only steps first (value
   pretraining, critic warm-up), then SAO steps; after each step the policy is
   published when its version changed, dead samplers are restarted, and every
   `run.eval_every` steps the held-out set is evaluated.
6. Outputs: a progress line per step, `metrics.jsonl`, TensorBoard events,
   orbax checkpoints (`checkpoint.directory`, default RUN_DIR/checkpoints) and
   `curves.png` at the end. A resumed (or restarted) run replaces the rows of
   the steps it trains again (`MetricsLogger.rewind`), so each step is logged once.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib
from typing import Iterator

import jax

from sao_jax import distributed
from sao_jax.config import Config
from sao_jax.data import pipeline
from sao_jax.data.records import Trajectory
from sao_jax.data.transport import DirectoryTransport, QueueTransport
from sao_jax.envs import coding_generator, math_tasks, style
from sao_jax.envs.base import play
from sao_jax.envs.registry import make_env, make_tasks
from sao_jax.evaluation import Evaluator
from sao_jax.learner import compile as compile_lib
from sao_jax.learner.loop import run_learner
from sao_jax.learner.sft import train_sft
from sao_jax.learner.state import state_from_params
from sao_jax.metrics import MetricsLogger, batch_metrics, plot_curves
from sao_jax.models import hf, params_io, tokenizer as tokenizer_lib
from sao_jax.models.transformer import Params, init_params
from sao_jax.models.value import value_params_from_policy
from sao_jax.sampler import weights
from sao_jax.sampler.worker import SamplerSupervisor, WorkerSpec
from sao_jax.types import Batch

# Scripted ideal turns per environment, for the SFT warm-start and the tokenizer.
DEMONSTRATIONS = {"math_tool": math_tasks.demonstration,
                  "coding": coding_generator.solution_actions,
                  "style": style.demonstration}
TOKENIZER_DEMONSTRATIONS = 400  # transcripts a run's own tokenizer is trained on


def demonstrations(cfg: Config) -> Iterator[list[dict]]:
  """Played demonstration transcripts (messages) of the training task source."""
  if cfg.env.name not in DEMONSTRATIONS:
    raise ValueError(f"run.sft_steps={cfg.run.sft_steps} but env.name={cfg.env.name!r} has no "
                     f"demonstrations (known: {sorted(DEMONSTRATIONS)}); set run.sft_steps=0")
  demo = DEMONSTRATIONS[cfg.env.name]
  for task in make_tasks(cfg.env):
    yield play(make_env(cfg.env), task, demo(task)).messages


def train_run_tokenizer(cfg: Config, transcripts: int = TOKENIZER_DEMONSTRATIONS):
  """A tokenizer of `model.vocab_size` tokens trained on the first `transcripts`
  demonstration transcripts."""
  texts = [m["content"] + " " + m["role"] for messages in
           itertools.islice(demonstrations(cfg), transcripts) for m in messages]
  return tokenizer_lib.train_tokenizer(texts, cfg.model.vocab_size)


def prepare_tokenizer(cfg: Config, run_dir: pathlib.Path):
  """The configured tokenizer, or one trained on the environment's texts (saved in run_dir)."""
  if cfg.run.tokenizer:
    tokenizer = tokenizer_lib.load_tokenizer(cfg.run.tokenizer)
  elif (run_dir / "tokenizer.json").is_file():
    tokenizer = tokenizer_lib.load_tokenizer(run_dir)
  else:
    tokenizer = train_run_tokenizer(cfg)
    tokenizer.save(str(run_dir / "tokenizer.json"))
  if tokenizer.get_vocab_size() > cfg.model.vocab_size:
    raise ValueError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens but "
                     f"model.vocab_size={cfg.model.vocab_size}; raise model.vocab_size")
  return tokenizer


def initial_policy(cfg: Config) -> Params:
  if cfg.run.init == "random":
    return init_params(cfg.model, jax.random.key(cfg.seed))
  path = pathlib.Path(cfg.run.init)
  if (path / "config.json").is_file():
    model_cfg, params = hf.load_hf(path)
  elif (path / params_io.CONFIG_FILE).is_file():
    model_cfg, _, params = params_io.load_params(path)
  else:
    raise ValueError(f"run.init={cfg.run.init!r} is neither 'random', a Hugging Face directory "
                     "(config.json) nor a sao-convert params directory")
  architecture = lambda c: {k: v for k, v in hf.hf_config(c).items() if k != "dtype"}
  if architecture(model_cfg) != architecture(cfg.model):
    raise ValueError(f"run.init={cfg.run.init!r} holds a model that differs from the `model` "
                     "section; copy its config.json values into the config file")
  return params


def sft_batches(cfg: Config, tokenizer, demos: Iterator[list[dict]]) -> Iterator[Batch]:
  """`run.sft_batch` demonstration transcripts (chat messages) per batch, padded to
  the smallest fitting length bucket."""
  length = cfg.data.length_buckets[-1]
  while True:
    rows = []
    for messages in itertools.islice(demos, cfg.run.sft_batch):
      tokens, action = tokenizer_lib.encode_chat(tokenizer, messages)
      if tokens.size > length:
        raise ValueError(f"a demonstration has {tokens.size} tokens, more than "
                         f"data.length_buckets[-1]={length}; raise the largest bucket")
      rows.append(Trajectory(tokens=tokens, action_mask=action.astype("int8"),
                             behavior_logp=(action * 0).astype("float32"),
                             rewards=(action * 0).astype("float32"), prompt_id=0,
                             policy_versions=(0, 0)))
    longest = max(t.length for t in rows)
    bucket = next(b for b in cfg.data.length_buckets if b >= longest)
    yield pipeline.pad_batch(rows, cfg.run.sft_batch, bucket, cfg.data.pad_id)


def sft_warm_start(cfg: Config, tokenizer, policy: Params, demos: Iterator[list[dict]], *,
                   log_metrics=lambda step, metrics: None, log=print) -> tuple[Params, dict]:
  """SFT of `policy` on `demos` (chat transcripts) as `cfg.run` says; returns (policy, record).

  With `run.sft_target_accuracy` > 0, every `run.sft_check_every` steps the
  policy plays `run.eval_episodes` greedy validation episodes (task seed
  `run.eval_seed + 1`, disjoint from the held-out evaluation set) and SFT stops
  at the first check whose accuracy reaches the target (each check is also
  passed to `log_metrics` as `sft/validation_accuracy`). The record holds the
  steps done, the last SFT loss and every (step, validation accuracy) check;
  `reached_target` is False when `run.sft_steps` ran out first (the last check
  is then taken at the end, so the record says where the policy landed).
  """
  run = cfg.run
  losses: list[float] = []
  checks: list[tuple[int, float]] = []
  validator = None

  def validate(steps_done: int, params: Params) -> bool:
    nonlocal validator
    params = jax.device_get(params)
    if validator is None:
      validator = Evaluator(cfg, tokenizer, params, seed=run.eval_seed + 1)
    accuracy = validator.evaluate(params, 0)["eval/accuracy"]
    checks.append((steps_done, accuracy))
    log_metrics(steps_done - 1, {"sft/validation_accuracy": accuracy})
    log(f"SFT step {steps_done}: validation accuracy {accuracy:.3f} "
        f"(target {run.sft_target_accuracy:.2f})")
    return accuracy >= run.sft_target_accuracy

  def log_step(step: int, metrics: dict) -> None:
    losses.append(metrics["sft/loss"])
    log_metrics(step, metrics)

  target = run.sft_target_accuracy
  log(f"SFT warm-start: {run.sft_steps} steps on demonstrations"
      + (f", or fewer once validation accuracy reaches {target:.2f}" if target else ""))
  policy, steps_done = train_sft(
      policy, cfg.model, sft_batches(cfg, tokenizer, demos), steps=run.sft_steps,
      learning_rate=run.sft_lr, log=log_step, stop=validate if target else None,
      check_every=run.sft_check_every)
  record = {"sft_steps": steps_done, "final_sft_loss": losses[-1] if losses else None}
  if target:
    reached = steps_done < run.sft_steps or validate(steps_done, policy)
    if not reached:
      log(f"SFT warm-start: validation accuracy {checks[-1][1]:.3f} after all "
          f"run.sft_steps={run.sft_steps} is below run.sft_target_accuracy={target}; "
          "RL starts from there (raise run.sft_steps to reach the target)")
    record.update(target_accuracy=target, reached_target=reached, validation=checks)
  return policy, record


def _transport(cfg: Config):
  """The learner's end of the transport. A directory is partitioned between the
  learner hosts (each reads only its shard of the records, whole GRPO groups in
  group mode) and reopened: a previous run's close marker would turn writers away."""
  if cfg.data.transport == "queue":
    if jax.process_count() > 1:
      raise ValueError(f"data.transport='queue' cannot feed a learner of {jax.process_count()} "
                       "hosts; use data.transport='directory'")
    return QueueTransport(cfg.data.transport_capacity)
  transport = DirectoryTransport(
      cfg.data.transport_dir, cfg.data.transport_capacity,
      shard=(jax.process_index(), jax.process_count()), by_prompt=cfg.algorithm.group_size > 1)
  transport.reopen()
  return transport


def local_batch_sizes(cfg: Config, hosts: int) -> tuple[int, int | None]:
  """(trajectories, packed tokens or None) of one learner host's share of a batch:
  each of `hosts` hosts loads `learner.batch_rows / hosts` rows."""
  learner = cfg.learner
  if learner.batch_rows % hosts:
    raise ValueError(f"learner.batch_rows={learner.batch_rows} (rows per batch) must be a "
                     f"multiple of the {hosts} learner hosts: each host loads an equal share")
  trajectories = learner.batch_trajectories // hosts
  if learner.batch_trajectories % hosts or trajectories % cfg.algorithm.group_size:
    raise ValueError(f"learner.batch_trajectories={learner.batch_trajectories} must split "
                     f"into {hosts} host shares of whole groups of algorithm.group_size="
                     f"{cfg.algorithm.group_size}")
  if learner.batch_tokens is None:
    return trajectories, None
  return trajectories, learner.batch_rows // hosts * learner.row_length


def run(cfg: Config, *, resume: bool = True, log=print) -> dict:
  """Trains as configured; returns the final summary (also in RUN_DIR/summary.json)."""
  distributed.initialize()  # a multi-host learner: join the cluster the environment names
  run_dir = pathlib.Path(cfg.run.run_dir)
  run_dir.mkdir(parents=True, exist_ok=True)
  if cfg.checkpoint.directory is None:
    cfg = dataclasses.replace(cfg, checkpoint=dataclasses.replace(
        cfg.checkpoint, directory=str(run_dir / "checkpoints")))
  cfg.validate()
  if jax.process_count() > 1 and cfg.run.eval_every:
    raise ValueError(f"run.eval_every={cfg.run.eval_every}: in-run evaluation needs the whole "
                     f"policy on one host, and this learner spans {jax.process_count()} hosts; "
                     "set run.eval_every=0 and evaluate checkpoints with sao-eval")
  if jax.process_count() > 1 and cfg.run.sft_target_accuracy:  # validate: sft_steps > 0
    raise ValueError(f"run.sft_target_accuracy={cfg.run.sft_target_accuracy}: checking it "
                     "needs the whole policy on one host; warm-start on one host "
                     "(python -m experiments.warm_start) and start this run from it (run.init)")
  batch_size, batch_tokens = local_batch_sizes(cfg, jax.process_count())
  (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
  tokenizer = prepare_tokenizer(cfg, run_dir)
  tokenizer_path = str(run_dir / "tokenizer.json")
  if not pathlib.Path(tokenizer_path).is_file():
    tokenizer.save(tokenizer_path)
  logger = MetricsLogger(run_dir, total_steps=cfg.learner.steps)
  evaluator = None

  def initial_state(mesh):
    logger.rewind(None)  # a fresh start: rows of an attempt killed before its first checkpoint go
    policy = initial_policy(cfg)
    if cfg.run.sft_steps:
      if cfg.run.eval_every:  # the starting point, so the warm-start's effect is measured
        evaluate(-cfg.run.sft_steps, policy, 0)
      policy, _ = sft_warm_start(cfg, tokenizer, policy, demonstrations(cfg), log=log,
                                 log_metrics=lambda step, m: logger.write(
                                     step - cfg.run.sft_steps, m))
    state = state_from_params(cfg, policy, value_params_from_policy(policy, cfg.model))
    if jax.process_count() > 1:  # every host holds the same full state on its own device;
      state = jax.device_get(state)  # from host memory, each places the shards it holds
    return jax.device_put(state, compile_lib.state_shardings(cfg, mesh))

  publisher = weights.make_publisher(cfg.sampler, jax.eval_shape(lambda: initial_policy(cfg)))
  transport = _transport(cfg)
  supervisor = SamplerSupervisor(
      [WorkerSpec(cfg=cfg, tokenizer_path=tokenizer_path, weights=publisher.spec,
                  transport=transport, worker_id=i) for i in range(cfg.run.num_samplers)],
      log=log)
  published = {"version": -1}
  drops = pipeline.Drops()
  batches = pipeline.learner_pipeline(
      transport, batch_size=batch_size, group_size=cfg.algorithm.group_size,
      max_lag=cfg.data.max_lag, buckets=cfg.data.length_buckets, pad_id=cfg.data.pad_id,
      vocab_size=cfg.model.vocab_size, current_version=lambda: published["version"], drops=drops,
      num_prompt_slots=(cfg.algorithm.running_mean_slots
                        if cfg.algorithm.variant == "running_mean" else None),
      batch_tokens=batch_tokens, row_length=cfg.learner.row_length)
  # Padding share per batch: what bucketing wastes and packing (learner.batch_tokens) saves.
  with_host_metrics = ((batch, {**batch_metrics(info, drops),
                                "batch/padding_frac": info.padding_fraction})
                       for batch, info in batches)
  summary: dict = {}

  def publish(state, force=False):
    version = int(jax.device_get(state.policy_version))
    if force or version != published["version"]:
      publisher.publish(state.policy_params, version)  # copies what it keeps: state is donated
      published["version"] = version
    return version

  def evaluate(step, policy, version):
    nonlocal evaluator
    params = jax.device_get(policy)
    if evaluator is None:
      evaluator = Evaluator(cfg, tokenizer, params, version=version)
    result = evaluator.evaluate(params, version)
    logger.write(step, result)
    summary.update(result)
    log(f"eval @ step {step}: accuracy {result['eval/accuracy']:.3f} "
        f"(tool-call rate {result['eval/tool_call_rate']:.2f})")

  def after_step(steps_done, state):
    version = publish(state)
    supervisor.check()
    if cfg.run.eval_every and steps_done % cfg.run.eval_every == 0:
      evaluate(steps_done, state.policy_params, version)

  reported_drops: set[str] = set()

  def on_metrics(step, metrics):
    logger.write(step, metrics)
    log(logger.progress(step, metrics))
    for reason in sorted(set(drops) - reported_drops):  # say once why data is being dropped
      reported_drops.add(reason)
      log(f"dropping trajectories: {reason} (e.g. {drops.examples.get(reason, '-')})")

  def on_start(state, resumed):
    if resumed:  # the steps after the checkpoint are trained and logged again
      logger.rewind(int(jax.device_get(state.step)))
    if cfg.run.eval_every and not resumed:
      evaluate(0, state.policy_params, 0)
    publish(state, force=True)
    supervisor.start()

  try:
    result = run_learner(cfg, with_host_metrics, on_metrics=on_metrics, after_step=after_step,
                         on_start=on_start, resume=resume, initial_state=initial_state, log=log)
  finally:
    transport.close()
    supervisor.stop()
    publisher.close()
    logger.close()
  summary.update({"steps_done": result.steps_done, "stopped_by": result.stopped_by,
                  "dropped": dict(drops), "sampler_restarts": supervisor.restarts,
                  "plot": str(plot_curves(run_dir))})
  (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
  return summary
