"""A tiny model, peaked random weights, a character detokenizer and engine helpers."""

import dataclasses
import string

import jax
import numpy as np

from sao_jax.config import ModelConfig
from sao_jax.config.sampler import SamplerConfig
from sao_jax.models import transformer
from sao_jax.sampler.engine import Engine

VOCAB = 64
MODEL = ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, head_dim=8,
                    num_attention_heads=4, num_key_value_heads=2, logits_chunk=16)
# The dense engine (the paged one's reference): 3 slots, two prefill buckets (so
# prompts > 16 tokens take several chunks).
SAMPLER = SamplerConfig(kv_layout="dense", slots=3, max_seq_len=96, prefill_buckets=(8, 16), steps_per_call=4,
                        max_new_tokens=12, stop_patterns=())
STOP = 5  # the stop token id of every test engine
CHARS = string.ascii_letters + string.digits + "`\n"
assert len(CHARS) == VOCAB


def detokenize(ids) -> str:
  """Token i is the character CHARS[i]."""
  return "".join(CHARS[i] for i in ids)


def params(seed: int = 0):
  """init_params scaled x10: N(0, 0.2) kernels give peaked, non-uniform next-token
  distributions, so stop tokens and truncation matter."""
  base = transformer.init_params(MODEL, jax.random.key(seed))
  return jax.tree.map(lambda x: x * 10.0 if x.ndim >= 2 else x, base)


def engine(weights, sampler: SamplerConfig = SAMPLER, engine_cls=Engine, **kwargs) -> Engine:
  kwargs.setdefault("stop_token_ids", (STOP,))
  if sampler.stop_patterns:
    kwargs.setdefault("detokenize", detokenize)
  return engine_cls(sampler, MODEL, weights, **kwargs)


def prompts(n: int, seed: int = 0) -> list[np.ndarray]:
  """n prompts of lengths 1..20 (some longer than the largest bucket)."""
  rng = np.random.default_rng(seed)
  return [rng.integers(0, VOCAB, 1 + (7 * i) % 20) for i in range(n)]


def run(eng: Engine) -> list:
  """Steps until idle; returns every Turn in order."""
  turns = []
  while eng.busy:
    turns += eng.step()
  return turns


def with_sampler(**changes) -> SamplerConfig:
  return dataclasses.replace(SAMPLER, **changes)
