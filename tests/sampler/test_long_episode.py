"""A long coding episode (hundreds of turns, observations far longer than actions)
flows through the engine, the environment and the learner: the action mask marks
exactly the sampled tokens, and skip-observation GAE sees only those."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import config as C
from sao_jax import losses
from sao_jax.chat import chat_format, tool_calls
from sao_jax.data import pipeline
from sao_jax.envs.coding import env as coding
from sao_jax.envs.coding import generator as coding_generator
from sao_jax.envs.registry import make_env
from sao_jax.learner import state as state_lib
from sao_jax.learner.step import StepConfig, advantages, train_step
from sao_jax.models.forward import value_forward
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.sampler.episodes import EpisodeRunner, make_engine

TURNS, NEW_TOKENS, LENGTH = 200, 4, 32768


@pytest.mark.slow
def test_long_coding_episode_through_engine_and_learner():
  env_cfg = C.EnvConfig(name="coding", difficulty=1, max_turns=TURNS, max_observation_chars=100)
  task = coding_generator.generate_task(0, seed=0, difficulty=1)
  texts = [task.prompt, coding.SYSTEM_PROMPT,
           *(tool_calls.render_turn(turn, "fenced")
             for turn in coding_generator.solution_actions(task))] * 4
  chat = chat_format(None, train_tokenizer(texts, vocab_size=320))
  model = C.ModelConfig(vocab_size=320, hidden_size=32, intermediate_size=64, head_dim=8,
                        num_attention_heads=4, num_key_value_heads=2, logits_chunk=512,
                        attention_impl="blocked", attention_block=512,
                        max_position_embeddings=LENGTH)
  sampler = C.SamplerConfig(slots=1, max_seq_len=LENGTH, prefill_buckets=(64, 256),
                            steps_per_call=NEW_TOKENS, max_new_tokens=NEW_TOKENS,
                            stop_patterns=())
  cfg = C.Config(model=model, sampler=sampler, env=env_cfg, mesh=C.MeshConfig(fsdp=1),
                 learner=C.LearnerConfig(batch_trajectories=1, critic_warmup_steps=0),
                 data=C.DataConfig(length_buckets=(LENGTH,)))
  state = state_lib.init_state(cfg, jax.random.key(0))
  engine = make_engine(sampler, model, state.policy_params, chat)
  runner = EpisodeRunner(engine, chat, lambda: make_env(env_cfg), max_episodes=1)
  runner.start(task, prompt_id=0, seed=0)
  done = []
  while not done:
    done = runner.step()
  traj = done[0]

  # The episode ran to its turn budget; every turn's sampled tokens are one action run.
  assert traj.info["turns"] == TURNS and traj.env_failure is None, (traj.info, traj.length)
  action = traj.action_mask.astype(bool)
  edges = np.diff(np.concatenate([[0], action.astype(int), [0]]))
  runs = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
  assert len(runs) == TURNS and runs.max() <= NEW_TOKENS
  assert (~action).sum() > 10 * action.sum()  # observations dwarf actions
  assert np.all(traj.behavior_logp[~action] == 0) and np.all(traj.behavior_logp[action] < 0)

  # Skip-observation GAE on the padded trajectory == plain GAE on its action tokens.
  batch = pipeline.pad_batch([traj], 1, LENGTH, pad_id=0)
  values = jax.jit(value_forward, static_argnums=1)(state.value_params, model, batch.tokens,
                                                      batch.segment_ids)
  adv, _ = jax.jit(functools.partial(advantages, cfg.algorithm))(batch, values, state.baseline)
  adv = np.asarray(adv)[0]
  assert np.all(adv[~np.asarray(batch.action_mask[0], bool)] == 0)
  n = int(action.sum())
  lam = 1 - 1 / (cfg.algorithm.lam_alpha * n)
  compact = lambda x: np.asarray(x)[0][np.asarray(batch.action_mask[0], bool)][None]
  plain, _ = losses.gae(compact(batch.rewards), compact(values), np.ones((1, n), bool),
                        gamma=1.0, lam=lam)
  np.testing.assert_allclose(adv[np.asarray(batch.action_mask[0], bool)], plain[0], atol=1e-5)

  # And the learner trains on it.
  step = jax.jit(functools.partial(train_step, cfg=StepConfig.of(cfg)))
  state, metrics = step(state, batch, jnp.asarray(True))
  # Undefined by definition, so NaN (the metrics writer keeps NaN in the JSONL and
  # skips it in TensorBoard): the explained variance, as a random policy earns 0 and
  # no return varies (losses.explained_variance); and the single-turn openings and
  # rewards, as the batch's one episode has several turns (_opening_advantages).
  # Every other metric is finite.
  undefined = {"value/explained_variance", "advantage/opening_single_turn",
               "reward/single_turn"}
  assert traj.outcome == 0.0
  assert {k for k, v in metrics.items() if not np.isfinite(float(v))} == undefined, metrics
  assert float(metrics["tokens/action"]) == n and int(state.policy_version) == 1
