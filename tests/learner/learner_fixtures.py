"""Tiny configs and batches shared by the learner and checkpoint tests."""

import dataclasses

import jax
import numpy as np

from sao_jax import config as C
from sao_jax.types import Batch

MODEL = C.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, logits_chunk=8)
BATCH, LENGTH = 8, 16


def make_config(variant: str = "sao", **learner) -> C.Config:
  algorithm = C.AlgorithmConfig.for_variant(variant, **(
      {"group_size": 2} if variant in ("grpo", "grpo_dis") else {}))
  learner = {"batch_trajectories": BATCH, "critic_warmup_steps": 0, "policy_lr": 1e-3,
             "value_lr": 1e-3, **learner}
  return C.Config(model=MODEL, algorithm=algorithm,
                  learner=C.LearnerConfig(**learner)).validate()


def make_batch(seed: int = 0, behavior_shift: float = 0.0, behavior_version: int = -1) -> Batch:
  """Prompt of 3, two action turns around an observation, right padding; outcome 0/1.

  `behavior_logp` is a plausible log-prob near the tiny model's uniform
  -log(64) ~ -4.16, shifted so some ratios leave the DIS band. Pairs of rows
  share a prompt id; every trajectory was sampled by `behavior_version` (-1:
  by several versions, so none is lag-0).
  """
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, MODEL.vocab_size, (BATCH, LENGTH)).astype(np.int32)
  attention = np.ones((BATCH, LENGTH), np.int32)
  action = np.zeros((BATCH, LENGTH), np.int32)
  rewards = np.zeros((BATCH, LENGTH), np.float32)
  for b in range(BATCH):
    end = LENGTH - (b % 3)
    attention[b, end:] = 0
    action[b, 3:7] = 1
    action[b, 9:end] = 1
    rewards[b, end - 1] = float(rng.integers(0, 2))
  behavior = rng.normal(-4.16 + behavior_shift, 0.3, (BATCH, LENGTH)).astype(np.float32)
  prompt_ids = np.where(attention > 0, np.arange(BATCH)[:, None] // 2, -1).astype(np.int32)
  versions = np.where(attention > 0, behavior_version, -1).astype(np.int32)
  return Batch(tokens, attention, action, np.where(action, behavior, 0.0).astype(np.float32),
               rewards, prompt_ids, versions)


def adam_counts(opt_state) -> list[int]:
  """The step counters of every Adam state inside an optax state."""
  counts = []
  def visit(node):
    if hasattr(node, "count") and hasattr(node, "mu"):
      counts.append(int(node.count))
    return node
  jax.tree.map(visit, opt_state, is_leaf=lambda n: hasattr(n, "mu"))
  return counts


def replace_model(cfg: C.Config, **changes) -> C.Config:
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **changes))


def with_routing(batch: Batch, cfg: C.Config, seed: int = 0) -> Batch:
  """`batch` with random sampler routing records: k distinct experts per token and MoE
  layer (every layer of `cfg.model` is MoE here) on action tokens, -1 elsewhere."""
  model = cfg.model
  rng = np.random.default_rng(seed)
  shape = batch.tokens.shape + (model.num_hidden_layers, model.num_experts)
  experts = np.argsort(rng.random(shape), axis=-1)[..., :model.num_experts_per_tok]
  experts[np.asarray(batch.action_mask) == 0] = -1
  return batch._replace(routed_experts=experts.astype(np.int8))
