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
from sao_jax.chat import ChatFormat, load_chat
from sao_jax.envs.registry import make_env, make_tasks
from sao_jax.models.transformer import Params
from sao_jax.sampler.episodes import EpisodeRunner, make_engine, run_to_completion


class Evaluator:

  def __init__(self, cfg: Config, chat: ChatFormat, params: Params, *, version: int = 0,
               seed: int | None = None):
    """`seed`: the task source's seed, `run.eval_seed` unless given."""
    sampler = dataclasses.replace(cfg.sampler, top_k=1, temperature=1.0)
    self._cfg = cfg
    self._env_cfg = dataclasses.replace(
        cfg.env, seed=cfg.run.eval_seed if seed is None else seed)
    self._engine = make_engine(sampler, cfg.model, params, chat, version=version)
    self._engine.warmup()
    self._runner = EpisodeRunner(self._engine, chat, lambda: make_env(self._env_cfg),
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


def evaluate_checkpoint(cfg: Config, step: int | None = None) -> dict:
  """Held-out evaluation of the policy in checkpoint `step` (default: the latest)
  of the run `cfg` describes, with the run's own tokenizer and chat format; what
  `sao-eval` prints."""
  from sao_jax.checkpoint import Checkpointer
  from sao_jax.learner.state import abstract_state

  cfg = cfg.with_run_paths().validate()
  chat = load_chat(cfg.run.tokenizer_file, enable_thinking=cfg.run.enable_thinking)
  checkpointer = Checkpointer(cfg)
  try:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                            abstract_state(cfg))
    state, _, meta = checkpointer.restore(abstract, step)
  finally:
    checkpointer.close()
  version = int(state.policy_version)
  result = Evaluator(cfg, chat, state.policy_params, version=version).evaluate(
      state.policy_params, version)
  return {"step": meta["step"], "policy_version": version, **result}
