"""The Pallas TPU ragged paged attention kernel (`sao_jax.models.paged_kernel`), run on
CPU in TPU interpret mode, equals the pure-JAX reference paths, for decode and for
prefill: ragged lengths, an inactive row, a partly filled last page, chunks after
different cached lengths (0 too) with padding tokens, GQA, a sliding window; float32.
The paged engine prefilling and decoding through it samples the reference engine's
tokens and behavior_logp."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.config import ModelConfig
from sao_jax.config.sampler import SamplerConfig
from sao_jax.models import transformer
from sao_jax.models.paged_attention import gathered_attention, ragged_attention
from sao_jax.models.paged_blocks import KernelBlocks
from sao_jax.models.paged_kernel import kernel_attention, kernel_unsupported, record_blocks
from sao_jax.sampler.paged_engine import PagedEngine
from sao_jax.sampler.paged_steps import (attention_choice, attention_path, compile_steps,
                                        new_cache)
from tpu_interpret import interpret

# head_dim 128: the kernel's online softmax needs a multiple of 128 (kernel_unsupported).
PAGES, PAGE, KV, GROUP, H = 12, 4, 2, 4, 128


def _relative_error(got, want) -> float:
  """max |got - want| over max |want|: relative, and defined where want is near 0."""
  return float(np.abs(np.asarray(got) - np.asarray(want)).max() / np.abs(np.asarray(want)).max())


# Keys each row holds (its new token included): 3 pages with the last one partly
# filled, an inactive row, a partly filled first page, exactly two full pages.
KV_LEN_B = np.array([9, 0, 3, 8], np.int32)
TABLE_BxM = np.array([[7, 2, 10], [-1, -1, -1], [5, -1, -1], [0, 11, -1]], np.int32)


def _inputs(seed: int = 0, tokens: int = 1):
  rng = np.random.default_rng(seed)
  q_BxTxNxH = rng.normal(size=(len(KV_LEN_B), tokens, KV * GROUP, H)).astype(np.float32)
  return q_BxTxNxH, rng.normal(size=(PAGES, PAGE, 2 * KV, H)).astype(np.float32)


def _decode_kernel(q_BxNxH, kv_pages, kv_len_B, table_BxM, window=None):
  """kernel_attention with one query per row, a row's query real where it holds keys."""
  return kernel_attention(q_BxNxH[:, None], kv_pages, (kv_len_B > 0)[:, None], kv_len_B,
                          table_BxM, window)[:, 0]


@pytest.mark.parametrize("window", [None, 3], ids=["full", "sliding_window"])
def test_kernel_matches_reference_on_ragged_rows(window):
  q_BxNxH, kv_pages = _inputs()
  q_BxNxH = q_BxNxH[:, 0]
  kv_len_B, table_BxM = KV_LEN_B, TABLE_BxM

  with interpret():
    got = _decode_kernel(*map(jnp.asarray, (q_BxNxH, kv_pages, kv_len_B, table_BxM)), window)
    got = np.asarray(got)

  rows, cols = np.nonzero(table_BxM >= 0)
  want = ragged_attention(*map(jnp.asarray, (q_BxNxH[:, None], kv_pages, (kv_len_B - 1)[:, None],
                                             rows.astype(np.int32), table_BxM[rows, cols],
                                             (cols * PAGE).astype(np.int32))), window)[:, 0]
  assert np.isfinite(got).all()
  assert _relative_error(got, want) <= 1e-5
  np.testing.assert_array_equal(got[1], 0.0)  # the inactive row, as in the reference


# Prefill: rows of C = 6 chunk slots, the real tokens first. Row 0 appends 4 tokens
# after 5 cached ones (2 padding tokens; its keys end in a partly filled third page),
# row 1 is a padding row, row 2 fills the chunk from position 0, row 3 appends 3
# tokens after 2 (pages 0 and 11, the second partly filled).
CHUNK = 6
START_B = np.array([5, 0, 0, 2], np.int32)
NEW_B = np.array([4, 0, 6, 3], np.int32)
PREFILL_TABLE_BxM = np.array([[7, 2, 10], [-1, -1, -1], [5, 9, -1], [0, 11, -1]], np.int32)


@pytest.mark.parametrize("window", [None, pytest.param(3, marks=pytest.mark.slow)],
                         ids=["full", "sliding_window"])
def test_kernel_prefill_matches_the_gathered_prefill_on_ragged_rows(window):
  """Each row's chunk attends causally after its cached tokens, through the kernel as
  through `gathered_attention` (the reference prefill); padding tokens get 0."""
  q_BxCxNxH, kv_pages = _inputs(seed=1, tokens=CHUNK)
  query_BxC = np.arange(CHUNK)[None, :] < NEW_B[:, None]
  pos_BxC = (START_B[:, None] + np.arange(CHUNK)[None, :]).astype(np.int32)

  with interpret():
    got = kernel_attention(*map(jnp.asarray, (q_BxCxNxH, kv_pages, query_BxC, START_B + NEW_B,
                                              PREFILL_TABLE_BxM)), window)
    got = np.asarray(got)

  want = np.asarray(gathered_attention(*map(jnp.asarray, (q_BxCxNxH, kv_pages, pos_BxC,
                                                          PREFILL_TABLE_BxM)), window))
  assert np.isfinite(got).all()
  assert _relative_error(got[query_BxC], want[query_BxC]) <= 1e-5
  np.testing.assert_array_equal(got[~query_BxC], 0.0)  # padding tokens and the padding row


# Blocks smaller than a row (the default suite runs the first case, ~15 s): decode rows
# of 3 pages read 3 KV blocks of one page and the 3 live queries span 2 query blocks;
# prefill rows read 2 KV blocks of 2 pages and the 13 packed query tokens (rows of 4,
# 6 and 3) span 4 query blocks of 4, rows starting and ending inside a block.
DECODE_BLOCKS = KernelBlocks(num_kv_pages_per_block=1, num_queries_per_block=2,
                             vmem_limit_bytes=None)
PREFILL_BLOCKS = KernelBlocks(num_kv_pages_per_block=2, num_queries_per_block=4,
                              vmem_limit_bytes=None)
MULTI_BLOCK_CASES = [
    pytest.param("prefill", "bfloat16", 3, id="prefill-bf16pool-window"),
    pytest.param("decode", "float32", None, id="decode-f32", marks=pytest.mark.slow),
    pytest.param("decode", "bfloat16", 3, id="decode-bf16pool-window", marks=pytest.mark.slow),
    pytest.param("prefill", "float32", None, id="prefill-f32", marks=pytest.mark.slow),
    pytest.param("decode", "float32", 3, id="decode-f32-window", marks=pytest.mark.slow),
    pytest.param("prefill", "bfloat16", None, id="prefill-bf16pool", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("mode, pool_dtype, window", MULTI_BLOCK_CASES)
def test_kernel_with_several_blocks_per_row_matches_the_reference(mode, pool_dtype, window):
  """Several KV blocks and query blocks per row (the online softmax across blocks, rows
  packed across query blocks) give the reference paths' softmax to float rounding, for
  a float32 and a bfloat16 pool (float32 queries; the reference reads the same bf16
  keys and values), with and without a sliding window."""
  tokens = 1 if mode == "decode" else CHUNK
  q_BxTxNxH, kv_pages = _inputs(seed=3, tokens=tokens)
  kv_pages = jnp.asarray(kv_pages, pool_dtype)
  if mode == "decode":
    query_BxT, kv_len_B, table_BxM = (KV_LEN_B > 0)[:, None], KV_LEN_B, TABLE_BxM
    blocks = DECODE_BLOCKS
    rows, cols = np.nonzero(table_BxM >= 0)
    want = ragged_attention(jnp.asarray(q_BxTxNxH), kv_pages, jnp.asarray((KV_LEN_B - 1)[:, None]),
                            jnp.asarray(rows, jnp.int32), jnp.asarray(table_BxM[rows, cols]),
                            jnp.asarray(cols * PAGE, jnp.int32), window)
  else:
    query_BxT = np.arange(CHUNK)[None, :] < NEW_B[:, None]
    kv_len_B, table_BxM, blocks = START_B + NEW_B, PREFILL_TABLE_BxM, PREFILL_BLOCKS
    pos_BxC = (START_B[:, None] + np.arange(CHUNK)[None, :]).astype(np.int32)
    want = gathered_attention(jnp.asarray(q_BxTxNxH), kv_pages, jnp.asarray(pos_BxC),
                              jnp.asarray(table_BxM), window)
  assert blocks.num_kv_pages_per_block < int((table_BxM >= 0).sum(axis=1).max())
  assert blocks.num_queries_per_block < int(query_BxT.sum())
  with interpret(), record_blocks() as used:
    got = np.asarray(kernel_attention(jnp.asarray(q_BxTxNxH), kv_pages, jnp.asarray(query_BxT),
                                      jnp.asarray(kv_len_B), jnp.asarray(table_BxM), window,
                                      blocks=blocks))
  assert used == [blocks]
  want = np.asarray(want)
  assert np.isfinite(got).all()
  assert _relative_error(got[query_BxT], want[query_BxT]) <= 1e-6
  np.testing.assert_array_equal(got[~query_BxT], 0.0)


@pytest.mark.slow  # a third interpreted kernel in this module
def test_kernel_call_without_queries_gives_zeros():
  """All rows padding (the engine's warm-up prefill): one dead sequence is listed so
  that the kernel's first prefetch is waited on, and every output is 0."""
  q_BxCxNxH, kv_pages = _inputs(seed=2, tokens=2)
  with interpret():
    got = kernel_attention(*map(jnp.asarray, (q_BxCxNxH, kv_pages, np.zeros((4, 2), bool),
                                              np.zeros(4, np.int32), np.full((4, 3), -1, np.int32))))
    np.testing.assert_array_equal(np.asarray(got), 0.0)


def test_kernel_support_names_what_it_cannot_take():
  assert kernel_unsupported(8, 2, 128, jnp.bfloat16) is None
  assert "head_dim=64" in kernel_unsupported(8, 2, 64, jnp.float32)
  assert "6 combined kv heads" in kernel_unsupported(6, 3, 128, jnp.float32)


@pytest.mark.parametrize("kv_heads, dtype, takes", [
    (1, jnp.bfloat16, True), (2, jnp.bfloat16, False), (4, jnp.bfloat16, False),
    (8, jnp.bfloat16, False), (1, jnp.float32, False)])
def test_kernel_support_of_head_dim_256_is_what_libtpu_compiles(kv_heads, dtype, takes):
  """head_dim 256 (Gemma 3) compiles only with an unstrided KV read: one KV head per device
  in bfloat16 (libtpu refuses the rest: "The last dim size is not 128 in original base
  memref"; tests/models/test_paged_kernel_shapes_tpu.py compiles each answer)."""
  reason = kernel_unsupported(4 * kv_heads, kv_heads, 256, dtype)
  if takes:
    assert reason is None
  else:
    assert f"head_dim=256 with {kv_heads} KV head(s) per device" in reason
    assert "strided read only from rows of 128 lanes" in reason
  assert kernel_unsupported(4 * kv_heads, kv_heads, 128, dtype) is None


# A model the kernel takes: head_dim 128, 4 query heads per KV head.
KERNEL_MODEL = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, head_dim=128,
                           num_attention_heads=4, num_key_value_heads=1, logits_chunk=16)
KERNEL_SAMPLER = SamplerConfig(slots=3, max_seq_len=48, prefill_buckets=(8, 16), steps_per_call=4,
                               max_new_tokens=10, stop_patterns=(), kv_page_size=4, kv_pages=12)


def _rollout(paged_attention: str) -> tuple[dict, dict]:
  """5 episodes of 2 turns on 3 slots; -> ({id: trajectory}, engine stats). Prefills
  start at 0 and after cached tokens: a 20-token prompt in two chunks (16 + 4),
  observations after a turn, two prompts sharing their first pages (the follower
  prefills after them), re-prefills of preempted episodes."""
  sampler = dataclasses.replace(KERNEL_SAMPLER, paged_attention=paged_attention)
  params = transformer.init_params(KERNEL_MODEL, jax.random.key(0))
  eng = PagedEngine(sampler, KERNEL_MODEL, params, stop_token_ids=(5,))
  rng = np.random.default_rng(0)
  shared = rng.integers(0, 64, 9)
  prompts = [shared, shared, rng.integers(0, 64, 20), rng.integers(0, 64, 3),
             rng.integers(0, 64, 6)]
  for i, prompt in enumerate(prompts):
    eng.submit(i, prompt, seed=100 + i, max_new_tokens=3 + i)
  observed, trajectories = set(), {}
  while eng.busy:
    for turn in eng.step():
      i = turn.episode_id
      if i in observed:
        trajectories[i] = eng.finish(i)
      else:
        observed.add(i)
        eng.submit(i, rng.integers(0, 64, 2 + i), max_new_tokens=4)
  return trajectories, dict(eng.stats)


@pytest.mark.slow  # two small rollouts, one through the interpreted kernel
def test_paged_engine_through_the_kernel_matches_the_reference():
  """paged_attention="pallas": prefill and decode both through the kernel."""
  want, want_stats = _rollout("reference")
  with interpret():
    got, got_stats = _rollout("pallas")
  assert sorted(got) == sorted(want) == [0, 1, 2, 3, 4]
  for i in want:
    np.testing.assert_array_equal(got[i].tokens, want[i].tokens, err_msg=f"episode {i}")
    np.testing.assert_allclose(got[i].behavior_logp, want[i].behavior_logp, rtol=0, atol=1e-5,
                               err_msg=f"episode {i}")
  assert got_stats == want_stats  # the same schedule: shared pages, a preemption, batched rows
  assert got_stats["shared_pages"] > 0 and got_stats["preemptions"] > 0
  assert got_stats["prefill_rows"] > got_stats["prefill_calls"]


@pytest.mark.parametrize("choice", ["pallas", "reference"])
def test_paged_prefill_program_holds_the_kernel_as_chosen(choice):
  """The prefill step `compile_steps` builds calls the kernel under "pallas" and
  not under "reference" (traced only: a TPU kernel lowers on CPU in interpret mode alone)."""
  sampler = dataclasses.replace(KERNEL_SAMPLER, paged_attention=choice)
  prefill = compile_steps(KERNEL_MODEL, sampler, (5,)).prefill
  params = jax.eval_shape(functools.partial(transformer.init_params, KERNEL_MODEL,
                                            jax.random.key(0)))
  cache = jax.eval_shape(functools.partial(new_cache, KERNEL_MODEL, sampler))
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
  jaxpr = jax.make_jaxpr(prefill)(params, cache, i32(3, 12), i32(4), i32(4, 8), i32(4, 8), i32(4),
                                  jax.ShapeDtypeStruct((4,), jnp.uint32))
  assert ("ragged_paged_attention_kernel" in str(jaxpr)) == (choice == "pallas")


def test_attention_path_is_the_kernel_on_tpu_or_when_asked():
  auto, pallas = KERNEL_SAMPLER, dataclasses.replace(KERNEL_SAMPLER, paged_attention="pallas")
  assert jax.default_backend() == "cpu"
  assert attention_path(auto, KERNEL_MODEL) == "reference"
  assert attention_path(pallas, KERNEL_MODEL) == "pallas"
  small_heads = dataclasses.replace(KERNEL_MODEL, head_dim=64)
  with pytest.raises(ValueError, match="sampler.paged_attention='pallas' is invalid for this "
                                       "model: .*head_dim=64 is not a multiple of 128"):
    attention_path(pallas, small_heads)


def test_attention_choice_says_why():
  """What the sampler logs and sao-plan prints beside the path (on TPU, "auto" for a model
  libtpu cannot compile the kernel for: tests/models/test_paged_kernel_shapes_tpu.py)."""
  auto = KERNEL_SAMPLER
  assert attention_choice(auto, KERNEL_MODEL) == (
      "reference", "sampler.paged_attention='auto' on cpu: the kernel is TPU-only")
  reference = dataclasses.replace(auto, paged_attention="reference")
  assert attention_choice(reference, KERNEL_MODEL) == (
      "reference", "sampler.paged_attention='reference'")
  # Gemma 3 4B's attention (8 query heads, 4 KV heads of 256) on one device.
  gemma = dataclasses.replace(KERNEL_MODEL, head_dim=256, num_attention_heads=8,
                              num_key_value_heads=4, compute_dtype="bfloat16")
  with pytest.raises(ValueError, match="sampler.paged_attention='pallas' is invalid for this "
                                       "model: .*head_dim=256 with 4 KV head"):
    attention_choice(dataclasses.replace(auto, paged_attention="pallas"), gemma)
