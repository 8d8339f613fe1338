"""Value params from policy params and the frozen-attention mask."""

import jax
import numpy as np
import pytest

from sao_jax.models import transformer, value
from sao_jax.models.transformer import param_path
from tiny import DENSE, MOE
ATTN = {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm/scale", "k_norm/scale"}


def _paths(tree, mask=None):
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {param_path(kp) for kp, leaf in flat if mask is None or leaf}


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_frozen_mask_selects_exactly_attention(cfg):
  params = value.value_params_from_policy(transformer.init_params(cfg, jax.random.key(0)), cfg)
  frozen = _paths(value.frozen_mask(params), mask=True)
  expected = {f"layers/{i}/attn/{name}" for i in range(cfg.num_hidden_layers) for name in ATTN}
  assert frozen == expected
  assert jax.tree.structure(value.frozen_mask(params)) == jax.tree.structure(params)


def test_custom_patterns_and_bad_regex():
  params = transformer.init_params(MOE, jax.random.key(0))
  frozen = _paths(value.frozen_mask(params, [r"/mlp/router$", r"^embed$"]), mask=True)
  assert frozen == {"layers/0/mlp/router", "embed"}
  with pytest.raises(ValueError, match=r"'\(unclosed'"):
    value.frozen_mask(params, ["(unclosed"])


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_value_params_from_policy(cfg):
  policy = transformer.init_params(cfg, jax.random.key(0))
  params = value.value_params_from_policy(policy, cfg)
  assert jax.tree.structure(params) == jax.tree.structure(transformer.abstract_params(cfg, "value"))
  assert "lm_head" not in params
  np.testing.assert_array_equal(params["value_head"]["kernel"], 0.0)
  np.testing.assert_array_equal(params["layers"][1]["attn"]["q_proj"], policy["layers"][1]["attn"]["q_proj"])
