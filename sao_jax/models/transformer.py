"""The decoder (any `sao_jax.config.families` family) as an nnx module, and its
params-as-pytree interface.

The learner never holds a module: params are a plain nested dict of arrays
(`{"embed": ..., "layers": {0: {"attn": {"q_proj": ...}}}}`), passed into jitted
functions and differentiated with `jax.grad`. Modules are rebuilt inside the
trace with `nnx.merge(graphdef(cfg, head), params)`, which costs nothing at run
time. Param paths are "/"-joined keys, e.g. "layers/0/attn/q_proj".

  init_params(cfg, rng, head="lm", mesh=None)  -> params (sharded when mesh given,
                                                   never materialised unsharded)
  abstract_params(cfg, head="lm")              -> params of jax.ShapeDtypeStruct
  logical_axes(cfg, head="lm")                 -> {path: logical axis names}
  param_shardings(cfg, mesh, head="lm")        -> params-shaped NamedShardings
  param_path(keypath)                          -> "layers/0/attn/q_proj"

`head` is "lm" (policy: LM head, tied to the embedding when
`tie_word_embeddings`) or "value" (critic: scalar head `value_head/kernel`,
`value_head/bias`, no LM head).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from sao_jax.config import ModelConfig
from sao_jax.config.families import FAMILIES
from sao_jax.models import layers
from sao_jax.sharding.rules import constrain, logical_to_spec

HEADS = ("lm", "value")
Params = dict[str, Any]


def is_moe_layer(cfg: ModelConfig, index: int) -> bool:
  """HF Qwen3-MoE rule: sparse unless listed in mlp_only_layers or off the sparse step."""
  return (cfg.num_experts > 0 and index not in cfg.mlp_only_layers
          and (index + 1) % cfg.decoder_sparse_step == 0)


def moe_layers(cfg: ModelConfig) -> int:
  """How many decoder layers are MoE (`is_moe_layer`): L of the routing records."""
  return sum(is_moe_layer(cfg, i) for i in range(cfg.num_hidden_layers))


class DecoderLayer(nnx.Module):
  """x + attn(norm(x)), then h + mlp(norm(h)) (pre-norm residual block).

  The Gemma 3 block also normalises each branch's output:
  h = x + post_attn_norm(attn(input_norm(x))), y = h + post_mlp_norm(mlp(pre_mlp_norm(h))).
  Norm names follow the HF tensors: `post_attn_norm` is post_attention_layernorm,
  which is the pre-MLP norm in the other families.
  """

  def __init__(self, cfg: ModelConfig, index: int, rngs: nnx.Rngs):
    d = cfg.hidden_size
    self.input_norm = layers.RMSNorm(d, cfg, rngs)
    self.attn = layers.Attention(cfg, index, rngs)
    self.post_attn_norm = layers.RMSNorm(d, cfg, rngs)
    self.gemma = FAMILIES[cfg.family].gemma
    if self.gemma:
      self.pre_mlp_norm = layers.RMSNorm(d, cfg, rngs)
      self.post_mlp_norm = layers.RMSNorm(d, cfg, rngs)
    self.mlp = layers.MoE(cfg, rngs) if is_moe_layer(cfg, index) else layers.MLP(cfg, rngs)

  def __call__(self, x_BxTxD, pos_BxT, visible_BxTxS, kv_cache, replay_BxTxK=None):
    """`replay_BxTxK`: recorded experts for an MoE layer (router replay), else None."""
    attn_BxTxD, new_cache = self.attn(self.input_norm(x_BxTxD), pos_BxT, visible_BxTxS, kv_cache)
    if self.gemma:
      h_BxTxD = x_BxTxD + self.post_attn_norm(attn_BxTxD)
      return h_BxTxD + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(h_BxTxD))), new_cache, None
    h_BxTxD = x_BxTxD + attn_BxTxD
    mlp_in = self.post_attn_norm(h_BxTxD)
    mlp_out = (self.mlp(mlp_in, replay_BxTxK) if isinstance(self.mlp, layers.MoE)
               else self.mlp(mlp_in))
    router_logits = None
    if isinstance(mlp_out, tuple):
      mlp_out, router_logits = mlp_out
    return h_BxTxD + mlp_out, new_cache, router_logits


class ValueHead(nnx.Module):
  """v = h . kernel + bias, zero-initialised so a fresh critic predicts 0."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.kernel = layers.param(rngs, (cfg.hidden_size,), ("embed",), cfg, init="zeros")
    self.bias = layers.param(rngs, (), (), cfg, init="zeros")


# ModelConfig.remat_policy -> what a rematerialised layer saves for the backward
# pass; everything else inside the layer is recomputed from its input.
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@functools.lru_cache(maxsize=None)
def _remat_layer(policy: str):
  """The layer call under `nnx.remat` with the named policy."""
  return nnx.remat(lambda layer, *args: layer(*args), policy=REMAT_POLICIES[policy])


class Decoder(nnx.Module):
  """Token embedding -> decoder layers -> final RMSNorm -> LM or value head.

  The Gemma 3 block multiplies the embedded tokens by sqrt(hidden_size), that
  factor first rounded to the embedding's dtype (transformers'
  Gemma3TextScaledWordEmbedding: 55.4256 becomes 55.5 in bfloat16).
  """

  def __init__(self, cfg: ModelConfig, head: str, rngs: nnx.Rngs):
    if head not in HEADS:
      raise ValueError(f"head={head!r} is invalid: allowed values are {HEADS}")
    d = cfg.hidden_size
    self.embed = layers.param(rngs, (cfg.vocab_size, d), ("vocab", "embed"), cfg)
    self.layers = nnx.List([DecoderLayer(cfg, i, rngs) for i in range(cfg.num_hidden_layers)])
    self.final_norm = layers.RMSNorm(d, cfg, rngs)
    if head == "lm" and not cfg.tie_word_embeddings:
      self.lm_head = layers.param(rngs, (d, cfg.vocab_size), ("embed", "vocab"), cfg)
    if head == "value":
      self.value_head = ValueHead(cfg, rngs)
    self.cfg = cfg
    self.head = head

  def trunk(self, tokens_BxT, pos_BxT, visible_BxTxS, kv_caches=None, replay_BxTxLxK=None):
    """Final-normed hidden states h_BxTxD (compute dtype), updated KV caches
    (one (k, v) per layer, or None) and router logits (one per MoE layer).

    `replay_BxTxLxK` (router replay): recorded experts of each of the L MoE layers in
    layer order, -1 where a token routes freely (`moe.route`); None routes every token.
    """
    cfg = self.cfg
    x_BxTxD = jnp.take(self.embed[...], tokens_BxT, axis=0)
    if FAMILIES[cfg.family].gemma:
      x_BxTxD = x_BxTxD * jnp.asarray(cfg.hidden_size ** 0.5, x_BxTxD.dtype)
    x_BxTxD = x_BxTxD.astype(cfg.compute_dtype)
    x_BxTxD = constrain(x_BxTxD, layers.BTD)
    if cfg.scan_layers and kv_caches is None:
      x_BxTxD, router_logits = self._scanned_layers(x_BxTxD, pos_BxT, visible_BxTxS,
                                                    replay_BxTxLxK)
      return self.final_norm(x_BxTxD), None, router_logits
    new_caches, router_logits = [], []
    for i, layer in enumerate(self.layers):
      cache = None if kv_caches is None else kv_caches[i]
      call = (layer if cfg.remat_policy == "none"
              else functools.partial(_remat_layer(cfg.remat_policy), layer))
      replay = None
      if replay_BxTxLxK is not None and isinstance(layer.mlp, layers.MoE):
        replay = replay_BxTxLxK[:, :, len(router_logits)]
      x_BxTxD, new_cache, logits = call(x_BxTxD, pos_BxT, visible_BxTxS, cache, replay)
      new_caches.append(new_cache)
      if logits is not None:
        router_logits.append(logits)
    return self.final_norm(x_BxTxD), (new_caches if kv_caches is not None else None), tuple(router_logits)

  def _scanned_layers(self, x_BxTxD, pos_BxT, visible_BxTxS, replay_BxTxLxK=None):
    """The decoder layers as one `lax.scan` (cfg.scan_layers).

    Params stay stored per layer (HF interop, checkpoints and sharding rules see
    one layout); they are stacked to [L, ...] here, a copy of the layer params
    per step that the scan body then reads one layer at a time. XLA compiles the
    body once instead of L times.
    """
    graphdef = nnx.graphdef(self.layers[0])
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(l) for l in self.layers])

    def body(x_BxTxD, inputs):
      layer_state, replay_BxTxK = inputs
      x_BxTxD, _, logits = nnx.merge(graphdef, layer_state)(x_BxTxD, pos_BxT, visible_BxTxS,
                                                            None, replay_BxTxK)
      return x_BxTxD, logits

    if self.cfg.remat_policy != "none":
      body = jax.checkpoint(body, policy=REMAT_POLICIES[self.cfg.remat_policy])
    # Scanned layers are all MoE or all dense (ModelConfig.validate): layer l replays
    # MoE layer l.
    replay_LxBxTxK = None if replay_BxTxLxK is None else jnp.moveaxis(replay_BxTxLxK, 2, 0)
    x_BxTxD, logits_L = jax.lax.scan(body, x_BxTxD, (stacked, replay_LxBxTxK))
    router_logits = () if logits_L is None else tuple(logits_L[i] for i in range(len(self.layers)))
    return x_BxTxD, router_logits

  def lm_kernel_DxV(self) -> jax.Array:
    """The LM head kernel (the transposed embedding when tied), compute dtype."""
    w = self.embed[...].T if self.cfg.tie_word_embeddings else self.lm_head[...]
    return w.astype(self.cfg.compute_dtype)


@functools.lru_cache(maxsize=None)
def _abstract_model(cfg: ModelConfig, head: str) -> tuple[nnx.GraphDef, Any]:
  cfg.validate()
  model = nnx.eval_shape(lambda: Decoder(cfg, head, nnx.Rngs(params=0)))
  return nnx.split(model, nnx.Param)


def graphdef(cfg: ModelConfig, head: str = "lm") -> nnx.GraphDef:
  """Static structure of the model; `nnx.merge(graphdef(cfg), params)` rebuilds it."""
  return _abstract_model(cfg, head)[0]


def model(params: Params, cfg: ModelConfig, head: str = "lm") -> Decoder:
  """The module view of `params` (inside a trace: no copies)."""
  return nnx.merge(graphdef(cfg, head), params)


def param_path(keypath: tuple) -> str:
  """'/'-joined names of a jax key path, e.g. 'layers/0/attn/q_proj'."""
  parts = []
  for key in keypath:
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
  return "/".join(parts)


def _init(cfg: ModelConfig, head: str, rng: jax.Array) -> Params:
  return nnx.to_pure_dict(nnx.state(Decoder(cfg, head, nnx.Rngs(params=rng)), nnx.Param))


def abstract_params(cfg: ModelConfig, head: str = "lm") -> Params:
  """Shapes and dtypes of the params, without allocating them."""
  return jax.eval_shape(functools.partial(_init, cfg, head), jax.random.key(0))


def logical_axes(cfg: ModelConfig, head: str = "lm") -> dict[str, tuple[str, ...]]:
  """Logical axis names of every param, keyed by param path."""
  state = _abstract_model(cfg, head)[1]
  return {"/".join(map(str, path)): var.get_metadata()["logical_axes"]
          for path, var in nnx.to_flat_state(state)}


def param_shardings(cfg: ModelConfig, mesh: jax.sharding.Mesh, head: str = "lm") -> Params:
  """NamedSharding per param from the rules table; ValueError if a dim does not divide."""
  axes = logical_axes(cfg, head)
  mesh_shape = dict(mesh.shape)

  def one(keypath, leaf):
    path = param_path(keypath)
    spec = logical_to_spec(axes[path], leaf.shape, mesh_shape, strict=True, what=f"param {path!r}")
    return jax.sharding.NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(one, abstract_params(cfg, head))


def init_params(cfg: ModelConfig, rng: jax.Array, head: str = "lm",
                mesh: jax.sharding.Mesh | None = None) -> Params:
  """Random params (HF init: N(0, 0.02) kernels, unit norms, zero biases). With `mesh`, each param is created directly in
  its sharding (jit out_shardings), so no device ever holds the full model."""
  return _jitted_init(cfg, head, mesh)(rng)


@functools.lru_cache(maxsize=None)
def _jitted_init(cfg: ModelConfig, head: str, mesh: jax.sharding.Mesh | None):
  # Cached: compiling the ~10 random draws per layer takes seconds on CPU.
  init = functools.partial(_init, cfg, head)
  if mesh is None:
    return jax.jit(init)
  return jax.jit(init, out_shardings=param_shardings(cfg, mesh, head))
