"""Evaluation: held-out greedy accuracy during training, and benchmark reports.

`Evaluator` (training, `run.eval_every`) owns an `Engine` (on the caller's
devices) with greedy sampling (top_k = 1) and runs `run.eval_episodes` tasks
from the environment's task source with `run.eval_seed` in place of
`env.seed`, the same tasks every time, so accuracy is comparable across steps.
Reported: `eval/accuracy` (mean final reward over episodes that did not fail),
`eval/failures`, `eval/mean_turns`, `eval/tool_call_rate` (episodes in which the
environment ran at least one tool; a reply with neither an answer nor a tool
call also earns another turn, so more turns alone do not mean tool use) and,
for tasks that name their data source, `eval/source/<source>` (its accuracy). Given
a path, it also writes the first `run.eval_transcripts` episodes (in task order)
as JSON lines: task id, reward, turns, environment failure and the whole
conversation as text (`write_transcripts`), since what a
collapsed policy writes says more than its accuracy (docs/get-started/demo.md).
With `run.eval_samples` = n > 0 it also plays each task n times sampled at
`run.eval_temperature` (a second engine) and reports `eval/sampled_accuracy`,
their mean reward: the accuracy of the policy as training samples it.

`benchmark` (what `sao-eval` runs) plays every task once greedily and, with
`run.eval_samples` = n > 0, n more times sampled at `run.eval_temperature`;
the report (`eval_scores`) holds greedy pass@1, mean@n and unbiased pass@k for
`run.eval_pass_k`, overall and per source, and under "failure_reasons" each kind of
environment failure (`env_failure/<kind>`, as the learner counts its drops) with
its count and first message. Its tasks: every row of a dataset
task source (`env.dataset`) in file order, or the first `run.eval_episodes`
tasks of another source (seeded with `run.eval_seed`); `limit` caps either.
Progress bars (tqdm, on a terminal) count finished episodes.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import pathlib
from typing import Iterator

import jax
import numpy as np
import tqdm

from sao_jax import storage
from sao_jax.chat import ChatFormat, load_chat
from sao_jax.config import Config, SamplerConfig
from sao_jax.config.dataset import DATASET_SOURCES
from sao_jax.data.failures import failure_key, kinds as failure_kinds
from sao_jax.data.pipeline import Drops
from sao_jax.envs import dataset_tasks
from sao_jax.envs.base import Task
from sao_jax.envs.registry import describe, make_env, make_tasks, resolve
from sao_jax.jobs import eval_scores, startup
from sao_jax.models.transformer import Params
from sao_jax.run import metrics
from sao_jax.sampler.episodes import EpisodeRunner, make_engine, run_to_completion
from sao_jax.types import Trajectory

GREEDY = dict(top_k=1, temperature=1.0)


class Episodes:
  """An engine with `sampler` settings and a runner of `cfg.env`-like episodes on it.

  `overlap=False`: the blocking runner (`EpisodeRunner`), whose schedule (which episodes
  are admitted, prefilled and share prompt pages together, and the order they finish
  in) does not depend on when environment steps return, so the same params and seeds
  give the same trajectories, in the same order, bit for bit. The overlapped default is
  faster but can differ in the last float bits of `behavior_logp`
  (docs/explanation/episode-lifecycle.md)."""

  def __init__(self, cfg: Config, sampler: SamplerConfig, env_cfg, chat: ChatFormat,
               params: Params, version: int, mesh: jax.sharding.Mesh | None = None, *,
               overlap: bool = True):
    self._num_slots = cfg.algorithm.running_mean_slots
    chat.require_role(make_env(env_cfg).observation_role, f"env.name={env_cfg.name!r}")
    self.engine = make_engine(sampler, cfg.model, params, chat, version=version, mesh=mesh)
    self.engine.warmup()
    self._runner = EpisodeRunner(self.engine, chat, lambda: make_env(env_cfg),
                                 max_episodes=sampler.slots, env_threads=sampler.num_env_threads(),
                                 overlap=overlap, env_name=describe(env_cfg))

  def run(self, tasks: Iterator[Task], count: int, *, seed: int, desc: str,
          leave: bool = True) -> list[Trajectory]:
    with tqdm.tqdm(total=count, desc=desc, unit="episode", disable=None, leave=leave) as bar:
      return run_to_completion(self._runner, tasks, count, num_slots=self._num_slots,
                               seed=seed, progress=bar.update)


class Evaluator:

  def __init__(self, cfg: Config, chat: ChatFormat, params: Params, *, version: int = 0,
               seed: int | None = None):
    """`seed`: the task source's seed, `run.eval_seed` unless given."""
    self._cfg = cfg
    self._env_cfg = dataclasses.replace(
        cfg.env, seed=cfg.run.eval_seed if seed is None else seed)
    self._episodes = Episodes(cfg, dataclasses.replace(cfg.sampler, **GREEDY), self._env_cfg,
                               chat, params, version)
    self._sampled = (Episodes(cfg, sampled_settings(cfg), self._env_cfg, chat, params, version)
                     if cfg.run.eval_samples else None)
    self._chat = chat

  def evaluate(self, params: Params, version: int, *,
               transcripts=None) -> dict[str, float]:
    """Metrics of the module docstring; with `transcripts`, the first
    `run.eval_transcripts` episodes are written there too."""
    self._episodes.engine.set_params(jax.device_put(params), version)
    episodes = self._cfg.run.eval_episodes
    tasks = list(itertools.islice(make_tasks(self._env_cfg), episodes))
    trajs = self._episodes.run(iter(tasks), episodes, seed=0, desc="eval", leave=False)
    if transcripts is not None and self._cfg.run.eval_transcripts:
      order = {task.id: i for i, task in enumerate(tasks)}
      first = sorted(trajs, key=lambda t: order[t.info["task"]])[:self._cfg.run.eval_transcripts]
      write_transcripts(transcripts, first, self._chat)
    ok = [t for t in trajs if t.env_failure is None]
    turns = np.array([t.info["turns"] for t in ok]) if ok else np.zeros(0)
    tools = np.array([t.info["tool_calls"] for t in ok]) if ok else np.zeros(0)
    result = {"eval/accuracy": float(np.mean([t.outcome for t in ok])) if ok else 0.0,
              "eval/failures": float(len(trajs) - len(ok)),
              "eval/mean_turns": float(turns.mean()) if ok else 0.0,
              "eval/tool_call_rate": float(np.mean(tools > 0)) if ok else 0.0}
    by_source = collections.defaultdict(list)
    for traj in ok:
      if traj.info.get("source"):
        by_source[traj.info["source"]].append(traj.outcome)
    result.update({f"eval/source/{source}": float(np.mean(outcomes))
                   for source, outcomes in sorted(by_source.items())})
    if self._sampled is not None:
      result.update(self._sampled_accuracy(params, version, tasks))
    return result

  def _sampled_accuracy(self, params: Params, version: int, tasks: list[Task]
                        ) -> dict[str, float]:
    """Mean reward of `run.eval_samples` episodes per task sampled at
    `run.eval_temperature` (the training sampler's distribution at temperature 1): what
    the policy earns when it samples, as it does in training. Greedy accuracy can jump
    from 0 to 1 on one near-tied opening token; this moves with the probabilities."""
    n = self._cfg.run.eval_samples
    self._sampled.engine.set_params(jax.device_put(params), version)
    trajs = self._sampled.run((task for task in tasks for _ in range(n)), len(tasks) * n,
                              seed=1, desc=f"eval sampled x{n}", leave=False)
    ok = [t for t in trajs if t.env_failure is None]
    return {"eval/sampled_accuracy": float(np.mean([t.outcome for t in ok])) if ok else 0.0}


def sampled_settings(cfg: Config) -> SamplerConfig:
  """The sampler of sampled evaluation: `run.eval_temperature`, no top-k / top-p truncation."""
  return dataclasses.replace(cfg.sampler, temperature=cfg.run.eval_temperature, top_k=0,
                             top_p=1.0)


class _BenchmarkTasks:
  """The tasks `benchmark` plays (module docstring), readable more than once."""

  def __init__(self, cfg: Config, limit: int | None):
    self.env_cfg = dataclasses.replace(cfg.env, seed=cfg.run.eval_seed)
    source = resolve(self.env_cfg).task_source
    self._table = (dataset_tasks.TaskTable(self.env_cfg.dataset, source)
                   if source in DATASET_SOURCES else None)
    self.name = self._table.name if self._table else f"{self.env_cfg.name}/{source}"
    total = len(self._table) if self._table else cfg.run.eval_episodes
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
      raise ValueError(f"limit={limit!r} is invalid: expected a number of tasks >= 1")
    self.count = total if limit is None else min(limit, total)

  def __iter__(self) -> Iterator[Task]:
    if self._table is not None:
      return (self._table[i] for i in range(self.count))
    return itertools.islice(make_tasks(self.env_cfg), self.count)


def benchmark(cfg: Config, chat: ChatFormat, params: Params, *, version: int = 0,
              limit: int | None = None, mesh: jax.sharding.Mesh | None = None) -> dict:
  """Greedy and sampled episodes on the benchmark tasks; the report of the module
  docstring. With `mesh`, the engines keep the params and KV cache sharded over it."""
  run = cfg.run
  tasks = _BenchmarkTasks(cfg, limit)
  sources: dict[str, str] = {}
  for task in tasks:  # checks every row before any compile; ids key the results
    if task.id in sources:
      raise ValueError(f"task id {task.id!r} appears twice in {tasks.name}; benchmark "
                       "results are kept per id (set env.dataset.id_column to a unique column, "
                       "or to '' for row numbers)")
    sources[task.id] = str(task.metadata.get("source", tasks.name))
  greedy_success, sampled_success = {}, collections.Counter()
  failures = collections.Counter()
  reasons = Drops()  # failed episodes by kind, each with its first message
  greedy = Episodes(cfg, dataclasses.replace(cfg.sampler, **GREEDY), tasks.env_cfg, chat,
                     params, version, mesh)
  for traj in greedy.run(iter(tasks), tasks.count, seed=run.eval_seed, desc="greedy"):
    greedy_success[traj.info["task"]] = _success(traj)
    failures[traj.info["task"]] += _failed(traj, reasons)
  del greedy  # its KV cache, before the sampling engine allocates one
  n = run.eval_samples
  if n:
    sampled = Episodes(cfg, sampled_settings(cfg), tasks.env_cfg, chat, params, version, mesh)
    repeated = (task for task in tasks for _ in range(n))
    for traj in sampled.run(repeated, tasks.count * n, seed=run.eval_seed + 1,
                            desc=f"sampled x{n}"):
      sampled_success[traj.info["task"]] += _success(traj)
      failures[traj.info["task"]] += _failed(traj, reasons)
  scores = [eval_scores.TaskScore(source, greedy_success[task_id], n, sampled_success[task_id],
                                  failures[task_id]) for task_id, source in sources.items()]
  return {"tasks": tasks.name, "samples": n, "temperature": run.eval_temperature if n else None,
          **eval_scores.summarize(scores, run.eval_pass_k if n else ()),
          "failure_reasons": {kind: {"count": count, "first_message": reasons.examples[kind]}
                              for kind, count in failure_kinds(reasons).items()}}


def _failed(traj: Trajectory, reasons: Drops) -> bool:
  """Whether the environment failed `traj`; if so it is counted in `reasons` by kind
  (`failures.failure_key`, as the learner counts its drops)."""
  if traj.env_failure is None:
    return False
  reasons.add(failure_key(traj), 1, traj.env_failure)
  return True


def write_transcripts(path, trajs: list[Trajectory], chat: ChatFormat) -> None:
  """One JSON line per episode: {"task", "reward", "turns", "env_failure", "text"},
  the text being the whole token sequence decoded (prompt, actions, observations,
  special tokens kept), written atomically (`metrics.write_jsonl`; `path` local or in a
  bucket, `sao_jax.storage`)."""
  metrics.write_jsonl(path, (
      {"task": traj.info.get("task"), "reward": traj.outcome, "turns": traj.info.get("turns"),
       "env_failure": traj.env_failure,
       "text": chat.tokenizer.decode(traj.tokens.tolist(), skip_special_tokens=False)}
      for traj in trajs))


def _success(traj: Trajectory) -> bool:
  """Full reward (a verified answer in math) from an episode the environment judged."""
  return traj.env_failure is None and traj.outcome >= 1.0


def report_path(cfg: Config, step: int):
  """Where `sao-eval` writes the JSON report of checkpoint `step` unless told otherwise
  (a path, or an epath.Path in a bucket run directory, `sao_jax.storage`)."""
  return storage.as_path(cfg.run.run_dir) / "eval" / f"step_{step}.json"


def unused_report_path(path):
  """`path`, or when a report is already there the first `<stem>.<n><suffix>` beside it
  (n = 2, 3, ...) that is not: a second `sao-eval` of the same checkpoint keeps the
  first report (it overwrote it before)."""
  candidate, number = path, 1
  while candidate.exists():
    number += 1
    candidate = path.with_name(f"{path.stem}.{number}{path.suffix}")
  return candidate


def policy_report_path(cfg: Config, policy_dir: str | pathlib.Path):
  """Where `sao-eval --policy DIR` writes its report unless told otherwise."""
  name = pathlib.Path(policy_dir).name
  return storage.as_path(cfg.run.run_dir) / "eval" / f"policy_{name}.json"


def transcripts_path(cfg: Config, step: int):
  """Where training writes the transcripts of its evaluation at `step` (negative
  steps: during the SFT warm-start); in the bucket of a bucket run directory."""
  return storage.as_path(cfg.run.run_dir) / "eval" / f"episodes_step_{step}.jsonl"


def restore_state(cfg: Config, step: int | None = None, mesh: jax.sharding.Mesh | None = None):
  """(train state, meta) of checkpoint `step` (default: the latest) of the run `cfg`
  describes, sharded over `mesh` as the learner shards it (default: one device);
  under LoRA the frozen base (not in checkpoints) is reloaded from `run.init`."""
  from sao_jax.learner import compile as compile_lib
  from sao_jax.learner import state as state_lib
  from sao_jax.models.value import value_params_from_policy
  from sao_jax.run import bootstrap
  from sao_jax.run.checkpoint import Checkpointer

  cfg = startup.check(cfg.with_run_paths())
  abstract = state_lib.abstract_state(cfg)
  if mesh is None:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: device, abstract)
  else:
    shardings = compile_lib.state_shardings(cfg, mesh)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          abstract, shardings)
  checkpointer = Checkpointer(cfg)
  try:
    state, _, meta = checkpointer.restore(state_lib.checkpointed(cfg, abstract), step)
  finally:
    checkpointer.close()
  if cfg.lora.enabled:
    base = bootstrap.initial_policy(cfg)
    fresh = state_lib.state_from_params(cfg, base, value_params_from_policy(base, cfg.model))
    state = state_lib.with_frozen_parts(cfg, state, jax.device_put(fresh, shardings))
  return state, meta


def restore_policy(cfg: Config, step: int | None, mesh: jax.sharding.Mesh) -> tuple[Params, dict]:
  """(policy params, meta) of checkpoint `step` (default: the latest) of the run `cfg`
  describes, each param on its shards of `mesh` (`param_shardings`). Only the policy
  is read from the checkpoint (`restore_items`): its params, or under LoRA its
  adapters, merged into the base reloaded from `run.init` onto the mesh; the
  critic, optimizer states and baselines stay on disk. Device memory: the policy
  (plus, under LoRA, the base as held and the adapters)."""
  from sao_jax.models import lora
  from sao_jax.models.transformer import param_shardings
  from sao_jax.run import bootstrap

  field = "policy_adapters" if cfg.lora.enabled else "policy_params"
  restored, meta = restore_items(cfg, (field,), step, mesh)
  if not cfg.lora.enabled:
    return restored[field], meta
  base = jax.jit(lora.frozen_base, static_argnums=(1, 2),
                 out_shardings=lora.base_shardings(cfg.model, cfg.lora, mesh))(
      bootstrap.initial_policy(cfg, mesh), cfg.model, cfg.lora)
  merge = jax.jit(lora.merge, static_argnums=(2, 3),
                  out_shardings=param_shardings(cfg.model, mesh, "lm"))
  return merge(base, restored[field], cfg.lora, cfg.model), meta


def restore_items(cfg: Config, fields: tuple[str, ...], step: int | None,
                  mesh: jax.sharding.Mesh) -> tuple[dict, dict]:
  """({field: tree}, meta): the `TrainState` `fields` of checkpoint `step` (default:
  the latest) and nothing else (`Checkpointer.restore_items`), each leaf read onto
  its shards of `mesh`: policy and value params as the sampler and learner lay
  them out (`param_shardings` of head "lm" or "value"), LoRA adapters (small)
  replicated, as the learner holds them."""
  from sao_jax.learner import state as state_lib
  from sao_jax.models.transformer import param_shardings
  from sao_jax.run.checkpoint import Checkpointer

  abstract = state_lib.abstract_state(cfg)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  layouts = {"policy_params": lambda: param_shardings(cfg.model, mesh, "lm"),
             "value_params": lambda: param_shardings(cfg.model, mesh, "value"),
             "policy_adapters": lambda: jax.tree.map(lambda _: replicated,
                                                     abstract.policy_adapters)}
  target = {}
  for field in fields:
    if field not in layouts:
      raise ValueError(f"restore_items: {field!r} is not one of {sorted(layouts)}")
    target[field] = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        getattr(abstract, field), layouts[field]())
  checkpointer = Checkpointer(cfg)
  try:
    return checkpointer.restore_items(target, step)
  finally:
    checkpointer.close()


def sampler_mesh(cfg: Config) -> jax.sharding.Mesh:
  """The mesh the evaluation engine runs on: `cfg.sampler_mesh()` over all devices
  (`eval_meshes`, which `startup.check` checks the paged pool against first)."""
  from sao_jax.sharding.mesh import make_mesh

  return make_mesh(cfg.sampler_mesh())


def eval_meshes(cfg: Config) -> list[int]:
  """`startup.check`'s `meshes` for sao-eval: its one engine spans every device
  (`sampler_mesh`), sampler.sharded or not; refused there before any policy loads."""
  return [jax.device_count()]


def evaluate_checkpoint(cfg: Config, step: int | None = None, *,
                        limit: int | None = None) -> dict:
  """`benchmark` of the policy in checkpoint `step` (default: the latest) of the run
  `cfg` describes (under LoRA, the base merged with the checkpoint's adapters), with
  the run's own tokenizer and chat format; what `sao-eval` reports. Only the policy
  is restored (`restore_policy`), straight onto its shards of the sampler mesh
  (`cfg.sampler_mesh()`) the engine runs on."""

  cfg, mesh, chat, policy, meta = checkpoint_policy(cfg, step)
  version = int(meta["policy_version"])
  result = benchmark(cfg, chat, policy, version=version, limit=limit, mesh=mesh)
  return {"step": meta["step"], "policy_version": version, **result}


def checkpoint_policy(cfg: Config, step: int | None = None):
  """(checked cfg, sampler mesh, chat format, policy params, meta) of checkpoint `step`
  (default: the latest) of the run `cfg` describes: what an engine over that policy
  needs, the params restored alone onto the sampler mesh (`restore_policy`)."""
  cfg = startup.check(cfg.with_run_paths(), eval_meshes)
  mesh = sampler_mesh(cfg)
  chat = load_chat(cfg.run.tokenizer_file, enable_thinking=cfg.run.enable_thinking)
  policy, meta = restore_policy(cfg, step, mesh)
  return cfg, mesh, chat, policy, meta


def evaluate_policy(cfg: Config, policy_dir: str | pathlib.Path, *,
                    limit: int | None = None) -> dict:
  """`benchmark` of the policy stored in `policy_dir`: a Hugging Face directory (a
  base model before RL, or a `sao-convert` export, LoRA merged) or a sao-convert
  params directory. Its model section and tokenizer are resolved from the
  directory as `run.init` would be (`config.init_model`); the config gives the
  environment, tasks, sampler and evaluation settings. Only the policy params
  are loaded, one tensor at a time, each onto its shard of the sampler mesh
  (`cfg.sampler_mesh()`): device memory is the params plus the eval batch's KV
  cache, never a train state."""
  cfg, mesh, chat, params = directory_policy(cfg, policy_dir)
  result = benchmark(cfg, chat, params, limit=limit, mesh=mesh)
  return {"policy": str(policy_dir), "step": None, "policy_version": None, **result}


def directory_policy(cfg: Config, policy_dir: str | pathlib.Path):
  """(checked cfg, sampler mesh, chat format, policy params) of the policy in
  `policy_dir`, loaded as `evaluate_policy` describes."""
  from sao_jax.config import init_model
  from sao_jax.models import hf, params_io

  cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, init=str(policy_dir)))
  cfg = startup.check(init_model.resolve(cfg.with_run_paths()), eval_meshes)
  checkpoint = init_model.read_init(cfg.run.init)
  init_model.merge_model(cfg.model, checkpoint.model, cfg.run.init)
  init_model.check_dtypes(cfg.model, jax.devices())
  tokenizer = cfg.run.tokenizer or cfg.run.tokenizer_file
  if not pathlib.Path(tokenizer).exists():
    raise FileNotFoundError(f"{str(policy_dir)!r} holds no tokenizer.json and run.tokenizer is "
                            "unset; pass --set run.tokenizer=<the model's tokenizer directory>")
  chat = load_chat(tokenizer, enable_thinking=cfg.run.enable_thinking)
  mesh = sampler_mesh(cfg)
  if checkpoint.kind == "hf":
    _, params = hf.load_hf(policy_dir, mesh)
  else:
    _, _, params = params_io.load_params(policy_dir, mesh)
  return cfg, mesh, chat, params
