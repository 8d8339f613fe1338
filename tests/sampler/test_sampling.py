"""Token sampling on hand-made logits: greedy limits, distributions, keys, behavior_logp."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import config as C
from sao_jax.sampler import sampling

LOGITS_4 = np.asarray([1.0, 0.5, -0.3, 2.0], np.float32)
N_DRAWS = 20000


def _softmax(z):
  e = np.exp(z - z.max())
  return e / e.sum()


@jax.jit
def _draw_many(seed):
  """N_DRAWS draws from LOGITS_4 for each (temperature, top_k, top_p) setting below."""
  logits = jnp.broadcast_to(jnp.asarray(LOGITS_4), (N_DRAWS, 4))
  keys = sampling.token_keys(jnp.full((N_DRAWS,), seed, jnp.uint32), jnp.arange(N_DRAWS))
  return {setting: sampling.sample(logits, keys, *setting) for setting in SETTINGS}


# (temperature, top_k, top_p) -> the kept tokens (others have probability 0).
SETTINGS = {(1.0, 0, 1.0): [0, 1, 2, 3], (0.7, 0, 1.0): [0, 1, 2, 3], (1.0, 2, 1.0): [0, 3],
            (1.0, 0, 0.8): [0, 3], (2.0, 3, 0.9): [0, 1, 3]}


def test_frequencies_match_the_truncated_softmax():
  draws = _draw_many(7)
  for setting, kept in SETTINGS.items():
    temperature = setting[0]
    p = _softmax(LOGITS_4 / temperature)
    q = np.zeros(4)
    q[kept] = p[kept] / p[kept].sum()
    tokens, logp = map(np.asarray, draws[setting])
    freq = np.bincount(tokens, minlength=4) / N_DRAWS
    # 5 binomial standard deviations: a false failure has probability ~1e-6.
    np.testing.assert_allclose(freq, q, atol=5 * np.sqrt(0.25 / N_DRAWS), err_msg=str(setting))
    # behavior_logp is log p under the full tempered softmax, not log q.
    np.testing.assert_allclose(logp, np.log(p)[tokens], rtol=1e-6, err_msg=str(setting))


def test_nucleus_keeps_the_token_that_crosses_top_p():
  # p = softmax(LOGITS_4) ~ [0.23, 0.14, 0.06, 0.57]: top_p = 0.6 needs tokens 3 and 0.
  keep = sampling.truncation_mask(jnp.asarray(LOGITS_4)[None], 0, 0.6)
  assert np.asarray(keep)[0].tolist() == [True, False, False, True]
  keep = sampling.truncation_mask(jnp.asarray(LOGITS_4)[None], 0, 0.5)
  assert np.asarray(keep)[0].tolist() == [False, False, False, True]


@pytest.mark.parametrize("top_k, top_p", [(1, 1.0), (0, 1e-6), (1, 0.5)])
def test_top_k_one_and_tiny_top_p_are_greedy(top_k, top_p):
  logits = jax.random.normal(jax.random.key(0), (6, 50)) * 3.0
  for index in range(20):
    keys = sampling.token_keys(jnp.arange(6, dtype=jnp.uint32), jnp.full((6,), index))
    tokens, _ = sampling.sample(logits, keys, 1.0, top_k, top_p)
    np.testing.assert_array_equal(tokens, np.argmax(logits, axis=-1))


def test_a_rows_draw_does_not_depend_on_the_other_rows():
  logits = jax.random.normal(jax.random.key(1), (5, 30))
  seeds = jnp.asarray([3, 1, 4, 1, 5], jnp.uint32)
  index = jnp.asarray([0, 7, 7, 9, 2])
  together, _ = sampling.sample(logits, sampling.token_keys(seeds, index), 0.9, 0, 0.95)
  shuffled = np.asarray([4, 2, 0, 3, 1])
  alone, _ = sampling.sample(logits[shuffled], sampling.token_keys(seeds[shuffled], index[shuffled]),
                             0.9, 0, 0.95)
  np.testing.assert_array_equal(np.asarray(together)[shuffled], alone)


def test_keys_depend_on_seed_and_position():
  keys = sampling.token_keys(jnp.asarray([0, 0, 1], jnp.uint32), jnp.asarray([0, 1, 0]))
  draws = np.asarray(jax.vmap(lambda k: jax.random.uniform(k))(keys))
  assert len(set(draws.tolist())) == 3


@pytest.mark.parametrize("field,value", [("top_k", 5), ("top_p", 0.9)])
def test_a_training_config_refuses_truncation(field, value):
  """behavior_logp is log p under the full tempered softmax; a truncated draw comes
  from q != p, which the DIS ratio cannot correct (docs/algorithm.md §2): refused by name."""
  cfg = C.Config(sampler=C.SamplerConfig(**{field: value}))
  with pytest.raises(ValueError, match=rf"sampler\.{field}={value!r} is invalid: .*DIS"):
    cfg.validate()
  C.Config().validate()  # untruncated: accepted
  C.SamplerConfig(**{field: value}).validate()  # evaluation's own sampler may truncate
