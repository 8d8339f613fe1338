"""Both engines record, per MoE layer, the experts each decoded token was routed to:
what the learner's forward routes it to, -1 where nothing decoded the token."""

import dataclasses

import jax
import numpy as np
import pytest

from engine_fixtures import MODEL, STOP, with_sampler
from sao_jax.models import forward, moe, transformer
from sao_jax.sampler.engine import Engine
from sao_jax.sampler.paged_engine import PagedEngine

MOE = dataclasses.replace(MODEL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                          tie_word_embeddings=False)
# One prefill bucket and one row bucket: one program of each kind to compile.
SAMPLERS = {
    "dense": with_sampler(slots=2, prefill_buckets=(16,), steps_per_call=4),
    "paged": with_sampler(kv_layout="paged", slots=2, prefill_buckets=(16,), steps_per_call=4,
                          kv_page_size=8, kv_pages=12, prefill_row_buckets=(2,)),
}
ENGINES = {"dense": Engine, "paged": PagedEngine}
PROMPTS = [[3, 9, 11, 2], [7] * 9, [1, 2, 3, 4, 5, 6]]
OBSERVATION = [12, 13, 14]


@pytest.fixture(scope="module")
def weights():
  base = transformer.init_params(MOE, jax.random.key(0))
  return jax.tree.map(lambda x: x * 10.0 if x.ndim >= 2 else x, base)


@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_engines_record_the_experts_of_every_decoded_token(weights, layout):
  eng = ENGINES[layout](SAMPLERS[layout], MOE, weights, stop_token_ids=(STOP,))
  for i, prompt in enumerate(PROMPTS):
    eng.submit(i, prompt, seed=10 + i, max_new_tokens=6 + 3 * i)
  generations, turns_left = {}, {i: 1 for i in range(len(PROMPTS))}
  while eng.busy:
    for turn in eng.step():
      if turns_left[turn.episode_id]:
        turns_left[turn.episode_id] -= 1
        eng.submit(turn.episode_id, OBSERVATION)
      else:
        generations[turn.episode_id] = eng.finish(turn.episode_id)
  policy_forward = jax.jit(forward.policy_forward, static_argnums=1)
  for generation in generations.values():
    routed = generation.routed_experts
    assert routed.dtype == np.int8 and routed.shape == (len(generation.tokens), 2, 2)
    action = generation.action_mask > 0
    # Decoded: every sampled token but each turn's last (fed by the next prefill, or never).
    decoded = action & np.append(action[1:], False)
    np.testing.assert_array_equal(routed[~decoded], -1)
    out = policy_forward(weights, MOE, generation.tokens[None], np.ones((1, len(action)), np.int32))
    learner = np.asarray(moe.routed_experts(out.router_logits, 2, 4))[0]
    np.testing.assert_array_equal(np.sort(routed[decoded], -1), np.sort(learner[decoded], -1))
    assert decoded.sum() >= 5
