"""MoE router replay (`moe.route` with recorded experts) against a hand-built reference:
transformers' Qwen3-MoE with its router forced to the same experts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import tiny
from tiny import build_hf, padded_batch
from sao_jax.models import forward, hf, moe

PROMPT = 4  # leading tokens of each row left without a record: they route freely


@pytest.fixture(scope="module")
def stale_by_one(tmp_path_factory):
  """(HF model and our (cfg, params) of the learner's policy, the sampler's policy one
  update older, tokens, mask): the update moved the router of the MoE layer (layer 0)."""
  model = build_hf("moe", seed=3)
  path = tmp_path_factory.mktemp("replay")
  model.save_pretrained(path)
  cfg, params = hf.load_hf(path)
  router = params["layers"][0]["mlp"]["router"]
  step = 0.2 * jax.random.normal(jax.random.key(1), router.shape, router.dtype)
  sampler = jax.tree.map(lambda x: x, params)
  sampler["layers"][0]["mlp"]["router"] = router - step
  tokens, mask = padded_batch(seed=5)
  return model, cfg, params, sampler, tokens, mask


def _recorded(cfg, sampler, tokens, mask):
  """What the sampler records: its own top-k per MoE layer, -1 on prompt and padding."""
  out = tiny.policy_forward(sampler, cfg, jnp.asarray(tokens), jnp.asarray(mask))
  experts = np.array(moe.routed_experts(out.router_logits, cfg.num_experts_per_tok,
                                        cfg.num_experts))
  unrecorded = (mask == 0) | (np.cumsum(mask, axis=1) <= PROMPT)
  experts[unrecorded] = -1
  return experts


def _forced_hf_logp(model, tokens, mask, experts_BxTxLxK):
  """log p(token t | x[:t]) from transformers with each MoE layer's router forced to
  the recorded experts (gates: its softmax at them, renormalised as configured); rows
  with a -1 keep HF's own top-k."""
  moe_layers = [layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "gate")]
  assert len(moe_layers) == experts_BxTxLxK.shape[2]
  originals = []
  for index, block in enumerate(moe_layers):
    gate = block.gate
    forced = torch.from_numpy(experts_BxTxLxK[:, :, index].reshape(-1, gate.top_k)).long()

    def forward(hidden, gate=gate, forced=forced):
      logits = torch.nn.functional.linear(hidden.reshape(-1, gate.hidden_dim), gate.weight)
      probs = torch.softmax(logits, dtype=torch.float, dim=-1)
      _, top = torch.topk(probs, gate.top_k, dim=-1)
      use = (forced >= 0).all(dim=-1, keepdim=True)
      chosen = torch.where(use, forced, top)
      weights = probs.gather(1, chosen)
      if gate.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
      return logits, weights.to(logits.dtype), chosen

    originals.append((gate, gate.forward))
    gate.forward = forward
  try:
    logits = tiny.hf_logits(model, tokens, mask)
  finally:
    for gate, original in originals:
      gate.forward = original
  logp = torch.log_softmax(torch.from_numpy(logits[:, :-1]), dim=-1)
  picked = logp.gather(2, torch.from_numpy(tokens[:, 1:]).long()[:, :, None])[:, :, 0].numpy()
  return np.concatenate([np.zeros_like(picked[:, :1]), picked], axis=1)


def test_replayed_logps_equal_a_forced_experts_reference(stale_by_one):
  """With replay, the learner's log-probs are those of a forward forced onto the stale
  sampler's experts (to 1e-4, the HF parity tolerance); without it they are not."""
  model, cfg, params, sampler, tokens, mask = stale_by_one
  experts = _recorded(cfg, sampler, tokens, mask)
  free = tiny.policy_forward(params, cfg, jnp.asarray(tokens), jnp.asarray(mask))
  learner_experts = np.asarray(moe.routed_experts(free.router_logits, cfg.num_experts_per_tok,
                                                  cfg.num_experts))
  recorded = experts[..., 0, 0] >= 0
  flipped = recorded & np.any(np.sort(learner_experts, -1) != np.sort(experts, -1), axis=(2, 3))
  assert flipped.sum() >= 3  # the stale router chose other experts for some tokens

  replayed = tiny.policy_forward(params, cfg, jnp.asarray(tokens), jnp.asarray(mask), 1.0,
                                 jnp.asarray(experts))
  reference = _forced_hf_logp(model, tokens, mask, experts)
  scored = np.zeros_like(mask, bool)
  scored[:, 1:] = (mask[:, 1:] > 0) & (mask[:, :-1] > 0)
  np.testing.assert_allclose(np.asarray(replayed.logp_BxT)[scored], reference[scored],
                             atol=1e-4, rtol=0)
  assert np.abs(np.asarray(free.logp_BxT)[scored] - reference[scored]).max() > 1e-3
  # The router logits stay the learner's own: replay changes what runs, not what it reports.
  np.testing.assert_array_equal(np.asarray(replayed.router_logits[0]),
                                np.asarray(free.router_logits[0]))


def test_replay_gates_keep_the_router_gradient(stale_by_one):
  """The router gets a gradient through the recomputed gates of the recorded experts."""
  _, cfg, params, sampler, tokens, mask = stale_by_one
  experts = jnp.asarray(_recorded(cfg, sampler, tokens, mask))

  def loss(router):
    changed = jax.tree.map(lambda x: x, params)
    changed["layers"][0]["mlp"]["router"] = router
    out = forward.policy_forward(changed, cfg, jnp.asarray(tokens), jnp.asarray(mask),
                                      1.0, experts)
    return jnp.sum(out.logp_BxT)

  grad = jax.jit(jax.grad(loss))(params["layers"][0]["mlp"]["router"])
  assert float(jnp.abs(grad).max()) > 1e-4


def test_expert_index_dtype_is_the_smallest_that_holds_the_experts():
  assert moe.expert_index_dtype(127) == np.int8
  assert moe.expert_index_dtype(128) == np.int16
  with pytest.raises(ValueError, match="num_experts=40000"):
    moe.expert_index_dtype(40000)
