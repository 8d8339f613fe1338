"""The Pallas TPU ragged paged attention kernel (`sao_jax.models.paged_kernel`), run on
CPU in TPU interpret mode, equals the pure-JAX reference path: ragged lengths, an
inactive row, a partly filled last page, GQA, a sliding window; float32. The paged
engine decoding through it samples the reference engine's tokens and behavior_logp."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from sao_jax.config import MeshConfig, ModelConfig
from sao_jax.config.sampler import SamplerConfig
from sao_jax.models import transformer
from sao_jax.models.paged_attention import ragged_attention
from sao_jax.models.paged_kernel import kernel_attention, kernel_unsupported
from sao_jax.sampler.paged_engine import PagedEngine
from sao_jax.sampler.paged_steps import decode_attention
from sao_jax.sharding.mesh import make_mesh, traced_on
from tpu_interpret import interpret

# head_dim 128: the kernel's online softmax needs a multiple of 128 (kernel_unsupported).
# GROUP >= the 4 rows: see tpu_interpret's docstring.
PAGES, PAGE, KV, GROUP, H = 12, 4, 2, 4, 128


def _relative_error(got, want) -> float:
  """max |got - want| over max |want|: relative, and defined where want is near 0."""
  return float(np.abs(np.asarray(got) - np.asarray(want)).max() / np.abs(np.asarray(want)).max())


# Keys each row holds (its new token included): 3 pages with the last one partly
# filled, an inactive row, a partly filled first page, exactly two full pages.
KV_LEN_B = np.array([9, 0, 3, 8], np.int32)
TABLE_BxM = np.array([[7, 2, 10], [-1, -1, -1], [5, -1, -1], [0, 11, -1]], np.int32)


def _inputs(seed: int = 0):
  rng = np.random.default_rng(seed)
  q_BxNxH = rng.normal(size=(len(KV_LEN_B), KV * GROUP, H)).astype(np.float32)
  return q_BxNxH, rng.normal(size=(PAGES, PAGE, 2 * KV, H)).astype(np.float32)


@pytest.mark.parametrize("window", [None, 3], ids=["full", "sliding_window"])
def test_kernel_matches_reference_on_ragged_rows(window):
  q_BxNxH, kv_pages = _inputs()
  kv_len_B, table_BxM = KV_LEN_B, TABLE_BxM

  with interpret():
    got = kernel_attention(jnp.asarray(q_BxNxH), jnp.asarray(kv_pages), jnp.asarray(kv_len_B),
                           jnp.asarray(table_BxM), window)
    got = np.asarray(got)

  rows, cols = np.nonzero(table_BxM >= 0)
  want = ragged_attention(*map(jnp.asarray, (q_BxNxH[:, None], kv_pages, (kv_len_B - 1)[:, None],
                                             rows.astype(np.int32), table_BxM[rows, cols],
                                             (cols * PAGE).astype(np.int32))), window)[:, 0]
  assert np.isfinite(got).all()
  assert _relative_error(got, want) <= 1e-5
  np.testing.assert_array_equal(got[1], 0.0)  # the inactive row, as in the reference


def test_kernel_support_names_what_it_cannot_take():
  assert kernel_unsupported(8, 2, 128, jnp.bfloat16) is None
  assert "head_dim=64" in kernel_unsupported(8, 2, 64, jnp.float32)
  assert "6 combined kv heads" in kernel_unsupported(6, 3, 128, jnp.float32)


@pytest.mark.slow  # the kernel interpreted on 8 devices
def test_kernel_on_a_mesh_splits_heads_over_tensor():
  """Under shard_map each device runs the kernel on its tensor shard of the heads
  (pool split as paged_cache_shardings splits it): the same output."""
  q_BxNxH, kv_pages = _inputs()
  mesh = make_mesh(MeshConfig(fsdp=4, tensor=2))
  pool = jax.device_put(kv_pages, NamedSharding(mesh, PartitionSpec(None, None, "tensor", None)))
  with interpret():
    want = kernel_attention(*map(jnp.asarray, (q_BxNxH, kv_pages, KV_LEN_B, TABLE_BxM)))
    got = jax.jit(traced_on(mesh, kernel_attention))(jnp.asarray(q_BxNxH), pool,
                                                     jnp.asarray(KV_LEN_B), jnp.asarray(TABLE_BxM))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# A model the kernel takes: head_dim 128, 4 query heads per KV head (>= the 3 slots).
KERNEL_MODEL = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, head_dim=128,
                           num_attention_heads=4, num_key_value_heads=1, logits_chunk=16)
KERNEL_SAMPLER = SamplerConfig(slots=3, max_seq_len=48, prefill_buckets=(8, 16), steps_per_call=4,
                               max_new_tokens=10, stop_patterns=(), kv_page_size=4, kv_pages=24)


def _rollout(paged_attention: str) -> dict:
  sampler = dataclasses.replace(KERNEL_SAMPLER, paged_attention=paged_attention)
  params = transformer.init_params(KERNEL_MODEL, jax.random.key(0))
  eng = PagedEngine(sampler, KERNEL_MODEL, params, stop_token_ids=(5,))
  rng = np.random.default_rng(0)
  for i, length in enumerate([3, 9, 14, 6]):  # 4 episodes on 3 slots: one waits for a slot
    eng.submit(i, rng.integers(0, 64, length), seed=100 + i, max_new_tokens=4 + 2 * i)
  generations = {}
  while eng.busy:
    for turn in eng.step():
      generations[turn.episode_id] = eng.finish(turn.episode_id)
  return generations


@pytest.mark.slow  # two small rollouts, one through the interpreted kernel
def test_paged_engine_decodes_through_the_kernel_like_the_reference():
  want = _rollout("reference")
  with interpret():
    got = _rollout("pallas")
  assert sorted(got) == sorted(want) == [0, 1, 2, 3]
  for i in want:
    np.testing.assert_array_equal(got[i].tokens, want[i].tokens, err_msg=f"episode {i}")
    np.testing.assert_allclose(got[i].behavior_logp, want[i].behavior_logp, rtol=0, atol=1e-5,
                               err_msg=f"episode {i}")


def test_decode_attention_is_the_kernel_on_tpu_or_when_asked():
  auto, pallas = KERNEL_SAMPLER, dataclasses.replace(KERNEL_SAMPLER, paged_attention="pallas")
  assert jax.default_backend() == "cpu"
  assert decode_attention(auto, KERNEL_MODEL) == "reference"
  assert decode_attention(pallas, KERNEL_MODEL) == "pallas"
  small_heads = dataclasses.replace(KERNEL_MODEL, head_dim=64)
  with pytest.raises(ValueError, match="sampler.paged_attention='pallas' is invalid for this "
                                       "model: .*head_dim=64 is not a multiple of 128"):
    decode_attention(pallas, small_heads)
