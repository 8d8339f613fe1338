"""Held-out evaluation: greedy episodes on tasks the learner never trains on.

`Evaluator` owns an `Engine` (on the caller's devices) with greedy sampling
(top_k = 1) and runs `episodes` tasks from the environment's task source with
`run.eval_seed` in place of `env.seed`, the same tasks every time, so accuracy
is comparable across steps. Reported: `eval/accuracy` (mean final reward over
episodes that did not fail), `eval/failures`, `eval/mean_turns`,
`eval/tool_call_rate` (episodes with more than one turn).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import numpy as np

from sao_jax.config import Config
from sao_jax.envs.registry import make_env, make_tasks
from sao_jax.models.transformer import Params
from sao_jax.sampler.episodes import EpisodeRunner, make_engine, run_to_completion


class Evaluator:

  def __init__(self, cfg: Config, tokenizer, params: Params, *, version: int = 0,
               seed: int | None = None):
    """`seed`: the task source's seed, `run.eval_seed` unless given."""
    sampler = dataclasses.replace(cfg.sampler, top_k=1, temperature=1.0)
    self._cfg = cfg
    self._env_cfg = dataclasses.replace(
        cfg.env, seed=cfg.run.eval_seed if seed is None else seed)
    self._engine = make_engine(sampler, cfg.model, params, tokenizer, version=version)
    self._engine.warmup()
    self._runner = EpisodeRunner(self._engine, tokenizer, lambda: make_env(self._env_cfg),
                                 max_episodes=sampler.slots)

  def evaluate(self, params: Params, version: int) -> dict[str, float]:
    self._engine.set_params(jax.device_put(params), version)
    episodes = self._cfg.run.eval_episodes
    tasks = itertools.islice(make_tasks(self._env_cfg), episodes)
    trajs = run_to_completion(self._runner, tasks, episodes,
                              num_slots=self._cfg.algorithm.running_mean_slots, seed=0)
    ok = [t for t in trajs if t.env_failure is None]
    turns = np.array([t.info["turns"] for t in ok]) if ok else np.zeros(0)
    return {"eval/accuracy": float(np.mean([t.outcome for t in ok])) if ok else 0.0,
            "eval/failures": float(len(trajs) - len(ok)),
            "eval/mean_turns": float(turns.mean()) if ok else 0.0,
            "eval/tool_call_rate": float(np.mean(turns > 1)) if ok else 0.0}


def restore_state(cfg: Config, step: int | None = None):
  """(train state, meta) of checkpoint `step` (default: the latest) of the run `cfg`
  describes, on one device; under LoRA the frozen base (not in checkpoints) is
  reloaded from `run.init`."""
  from sao_jax import warm_start
  from sao_jax.checkpoint import Checkpointer
  from sao_jax.learner import state as state_lib
  from sao_jax.models.value import value_params_from_policy

  cfg = cfg.with_run_paths().validate()
  checkpointer = Checkpointer(cfg)
  try:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                            state_lib.abstract_state(cfg))
    state, _, meta = checkpointer.restore(state_lib.checkpointed(cfg, abstract), step)
  finally:
    checkpointer.close()
  if cfg.lora.enabled:
    base = warm_start.initial_policy(cfg)
    fresh = state_lib.state_from_params(cfg, base, value_params_from_policy(base, cfg.model))
    state = state_lib.with_frozen_parts(cfg, state, fresh)
  return state, meta


def evaluate_checkpoint(cfg: Config, step: int | None = None) -> dict:
  """Held-out evaluation of the policy in checkpoint `step` (default: the latest)
  of the run `cfg` describes, with the run's own tokenizer; what `sao-eval` prints."""
  from sao_jax.learner.state import policy_weights
  from sao_jax.models.tokenizer import load_tokenizer

  cfg = cfg.with_run_paths().validate()
  tokenizer = load_tokenizer(cfg.run.tokenizer_file)
  state, meta = restore_state(cfg, step)
  version = int(state.policy_version)
  policy = policy_weights(cfg, state)
  result = Evaluator(cfg, tokenizer, policy, version=version).evaluate(policy, version)
  return {"step": meta["step"], "policy_version": version, **result}
