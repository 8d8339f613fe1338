"""KV-cache decoding reproduces the full forward, incl. chunked mid-sequence prefill."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.models import decode, transformer
from tiny import DENSE, MOE, decode_step, extend, logits_forward


def _full_logits(params, cfg, tokens_list):
  """Next-token logits after each token of each row, from the full forward."""
  return [np.asarray(logits_forward(params, cfg, jnp.asarray([t]), jnp.ones((1, len(t)), jnp.int32)))[0]
          for t in tokens_list]


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_prefill_then_token_by_token(cfg):
  params = transformer.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 256, 5), rng.integers(0, 256, 3)]
  cont = rng.integers(0, 256, (2, 4))
  # Left-pad the ragged prompts into one prefill chunk.
  tokens = np.zeros((2, 5), np.int32)
  mask = np.zeros((2, 5), np.int32)
  for b, p in enumerate(prompts):
    tokens[b, 5 - len(p):], mask[b, 5 - len(p):] = p, 1
  full = _full_logits(params, cfg, [np.concatenate([p, c]) for p, c in zip(prompts, cont)])
  cache = decode.init_cache(cfg, 2, 16)
  logits, cache = extend(params, cfg, cache, tokens, mask)
  for b, p in enumerate(prompts):
    np.testing.assert_allclose(logits[b], full[b][len(p) - 1], atol=1e-4)
  for step in range(4):
    logits, cache = decode_step(params, cfg, cache, jnp.asarray(cont[:, step]))
    for b, p in enumerate(prompts):
      np.testing.assert_allclose(logits[b], full[b][len(p) + step], atol=1e-4, err_msg=f"step {step}")


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_chunked_prefill_of_observation_mid_sequence(cfg):
  """prompt -> 2 sampled tokens -> ragged observations (right-padded chunk) -> decode."""
  params = transformer.init_params(cfg, jax.random.key(1))
  rng = np.random.default_rng(1)
  prompt = rng.integers(0, 256, (2, 4))
  actions = rng.integers(0, 256, (2, 2))
  observations = [rng.integers(0, 256, 3), rng.integers(0, 256, 1)]
  after = rng.integers(0, 256, (2, 2))
  obs_tokens = np.zeros((2, 3), np.int32)
  obs_mask = np.zeros((2, 3), np.int32)
  for b, o in enumerate(observations):
    obs_tokens[b, :len(o)], obs_mask[b, :len(o)] = o, 1
  rows = [np.concatenate([prompt[b], actions[b], observations[b], after[b]]) for b in range(2)]
  full = _full_logits(params, cfg, rows)

  cache = decode.init_cache(cfg, 2, 12)
  _, cache = extend(params, cfg, cache, prompt, np.ones_like(prompt))
  for step in range(2):
    _, cache = decode_step(params, cfg, cache, jnp.asarray(actions[:, step]))
  logits, cache = extend(params, cfg, cache, obs_tokens, obs_mask)
  for b, o in enumerate(observations):
    np.testing.assert_allclose(logits[b], full[b][6 + len(o) - 1], atol=1e-4)
  for step in range(2):
    logits, cache = decode_step(params, cfg, cache, jnp.asarray(after[:, step]))
    for b, o in enumerate(observations):
      np.testing.assert_allclose(logits[b], full[b][6 + len(o) + step], atol=1e-4)
  assert cache.length_B.tolist() == [11, 9]


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_rows_reset_and_refill_independently(cfg):
  """Row 0 is rolled back to 2 tokens and row 1 reset and refilled (left-padded chunk)
  while the other row continues; every row still matches the full forward."""
  params = transformer.init_params(cfg, jax.random.key(2))
  rng = np.random.default_rng(2)
  first = rng.integers(0, 256, (2, 5))
  row0_tail = rng.integers(0, 256, 3)   # replaces first[0, 2:]
  row1_new = rng.integers(0, 256, 2)    # a new sequence in row 1
  cont = rng.integers(0, 256, (2, 3))
  rows = [np.concatenate([first[0, :2], row0_tail, cont[0]]), np.concatenate([row1_new, cont[1]])]
  full = _full_logits(params, cfg, rows)

  cache = decode.init_cache(cfg, 2, 10)
  _, cache = extend(params, cfg, cache, first, np.ones_like(first))
  cache = decode.truncate(cache, jnp.asarray([2, 0]))
  chunk = np.asarray([row0_tail, [0, *row1_new]], np.int32)
  chunk_mask = np.asarray([[1, 1, 1], [0, 1, 1]], np.int32)
  logits, cache = extend(params, cfg, cache, chunk, chunk_mask)
  np.testing.assert_allclose(logits[0], full[0][4], atol=1e-4)
  np.testing.assert_allclose(logits[1], full[1][1], atol=1e-4)
  for step in range(3):
    logits, cache = decode_step(params, cfg, cache, jnp.asarray(cont[:, step]))
    np.testing.assert_allclose(logits[0], full[0][5 + step], atol=1e-4, err_msg=f"step {step}")
    np.testing.assert_allclose(logits[1], full[1][2 + step], atol=1e-4, err_msg=f"step {step}")
  assert cache.length_B.tolist() == [8, 5]


def test_row_without_real_tokens_is_untouched():
  params = transformer.init_params(DENSE, jax.random.key(3))
  tokens = np.arange(8, dtype=np.int32).reshape(2, 4)
  cache = decode.init_cache(DENSE, 2, 6)
  _, cache = extend(params, DENSE, cache, tokens, np.ones_like(tokens))
  _, after = extend(params, DENSE, cache, tokens[:, :2], np.asarray([[1, 1], [0, 0]]))
  assert after.length_B.tolist() == [6, 4]
  for k_before, k_after in zip(cache.k, after.k):
    np.testing.assert_array_equal(k_after[1], k_before[1])


def test_init_cache_rejects_bad_sizes():
  with pytest.raises(ValueError, match="max_len=0"):
    decode.init_cache(DENSE, 2, 0)
