"""Ragged (and gathered) paged attention == jax's own reference for its Pallas TPU kernel
(`ref_ragged_paged_attention`), on pages shuffled through a pool, for a mixed
batch of decode rows (1 query) and prefill rows (several queries)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ref_ragged_paged_attention

from sao_jax.models.paged_attention import gathered_attention, ragged_attention

PAGES, PAGE, KV, GROUP, H = 12, 4, 2, 3, 8


@pytest.mark.parametrize("window", [None, 3], ids=["full", "sliding_window"])
def test_ragged_attention_matches_jax_reference(window):
  rng = np.random.default_rng(0)
  kv_lens = np.array([9, 1, 6], np.int32)   # keys each row holds, its new queries included
  q_lens = np.array([1, 1, 4], np.int32)    # two decode rows, one 4-token prefill chunk
  table = np.array([[7, 2, 10], [5, -1, -1], [0, 11, -1]], np.int32)
  # The kernel's combined pool (ours too): k at even, v at odd combined heads.
  kv_pages = rng.normal(size=(PAGES, PAGE, 2 * KV, H)).astype(np.float32)
  b, t = len(kv_lens), int(q_lens.max())
  q_BxTxNxH = rng.normal(size=(b, t, KV * GROUP, H)).astype(np.float32)

  # Ours: every allocated (row, column) is an entry; padding queries sit past q_len.
  rows, cols = np.nonzero(table >= 0)
  pos_BxT = (kv_lens - q_lens)[:, None] + np.arange(t)[None, :]
  out = ragged_attention(*map(jnp.asarray, (q_BxTxNxH, kv_pages, pos_BxT.astype(np.int32),
                                             rows.astype(np.int32), table[rows, cols],
                                             (cols * PAGE).astype(np.int32))), window)

  # jax's reference: queries concatenated.
  queries = np.concatenate([q_BxTxNxH[i, :q_lens[i]] for i in range(b)])
  cu_q_lens = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
  want = ref_ragged_paged_attention(jnp.asarray(queries), jnp.asarray(kv_pages), kv_lens,
                                    np.maximum(table, 0), cu_q_lens, np.array([b], np.int32),
                                    sm_scale=H ** -0.5, sliding_window=window)
  got = np.concatenate([np.asarray(out)[i, :q_lens[i]] for i in range(b)])
  np.testing.assert_allclose(got, np.asarray(want), rtol=0, atol=1e-5)
  assert jax.numpy.isfinite(out).all()
  # The prefill path: whole page tables gathered, one softmax per row.
  gathered = gathered_attention(*map(jnp.asarray, (q_BxTxNxH, kv_pages, pos_BxT.astype(np.int32),
                                                   table)), window)
  got = np.concatenate([np.asarray(gathered)[i, :q_lens[i]] for i in range(b)])
  np.testing.assert_allclose(got, np.asarray(want), rtol=0, atol=1e-5)
