"""Fixtures of the agent-endpoint tests: a tiny random policy behind a Qwen2.5 chat template."""

import dataclasses
import pathlib
import sys

import jax
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "chat"))  # chat_fixtures
from chat_fixtures import build_tokenizer_dir  # noqa: E402

from sao_jax.chat import load_chat  # noqa: E402
from sao_jax.config import ModelConfig  # noqa: E402
from sao_jax.config.sampler import SamplerConfig  # noqa: E402
from sao_jax.models import transformer  # noqa: E402

SAMPLER = SamplerConfig(kv_layout="dense", slots=4, max_seq_len=1024, prefill_buckets=(64, 512),
                        steps_per_call=4, max_new_tokens=10, stop_patterns=(), temperature=1.0)


@dataclasses.dataclass(frozen=True)
class Policy:
  chat: object
  model: ModelConfig
  params: object


@pytest.fixture(scope="session")
def policy(tmp_path_factory):
  """Qwen2.5's template (hermes tool calls) over a tiny BPE; a tiny model of its vocabulary
  with peaked random weights, so turns end on <|im_end|> now and then."""
  chat = load_chat(build_tokenizer_dir(tmp_path_factory.mktemp("agent_tok"), "qwen2_5"))
  model = ModelConfig(vocab_size=chat.tokenizer.get_vocab_size(), hidden_size=32,
                      intermediate_size=64, head_dim=8, num_attention_heads=4,
                      num_key_value_heads=2, logits_chunk=16, max_position_embeddings=1024)
  base = transformer.init_params(model, jax.random.key(0))
  params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, base)
  return Policy(chat, model, params)
