"""LoRA adapters on the policy's projections: a separate, small param tree.

For a targeted kernel W (our layout, `sao_jax.models.layers`) whose first
`KERNEL_DIMS[name][0]` dims are its input and the rest its output, viewed as a
matrix W [in, out] (q_proj [D, N, H] is [D, N*H], o_proj [N, H, D] is [N*H, D]):

    W' = W + s * A B,   A [in, r], B [r, out],   s = alpha / r

B starts at zero, so W' = W at step 0; A starts like PEFT's default
(kaiming-uniform, a=sqrt(5): U(-1/sqrt(in), 1/sqrt(in))). Adapters are float32.
With G = dL/dW' the gradient of the merged model, the chain rule gives

    dL/dA = s * G B^T,   dL/dB = s * A^T G

which `tests/models/test_lora.py` checks against jax's gradient of the merged model.

  adapter_paths(model_cfg, lora_cfg)     -> {param path: (in, out)} of the targets
  init_adapters(model_cfg, lora_cfg, rng)-> {path-nested dict: {"a": A, "b": B}}
  abstract_adapters(model_cfg, lora_cfg) -> the same as jax.ShapeDtypeStruct
  merge(base, adapters, lora_cfg)        -> params with every targeted W replaced by W'

The adapters tree nests like the params (`adapters["layers"][0]["attn"]["q_proj"]
["a"]`), so orbax, the weight channels and `param_path` treat it as any params.
`merge` runs inside the jitted step (the learner differentiates the adapters
through it; the frozen base is a constant with no gradient) and in the sampler
when new adapters arrive. W' is stored in W's dtype: with a bfloat16 base the
forward sees bf16(W + s A B), exactly what a full fine-tune's bf16 weights see.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from sao_jax.config import LoraConfig, ModelConfig
from sao_jax.models.transformer import Params, abstract_params, param_path

# Each targetable kernel: (leading dims that are its input, its rank as a dense kernel);
# the dims after the input ones are its output.
KERNEL_DIMS = {"q_proj": (1, 3), "k_proj": (1, 3), "v_proj": (1, 3), "o_proj": (2, 3),
               "gate_proj": (1, 2), "up_proj": (1, 2), "down_proj": (1, 2)}


def adapter_paths(model_cfg: ModelConfig, lora_cfg: LoraConfig) -> dict[str, tuple[int, int]]:
  """{param path: (in, out)} of every targeted kernel of the policy, in params order.

  ValueError if a target matches no kernel of this model."""
  found: dict[str, tuple[int, int]] = {}
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(abstract_params(model_cfg, "lm"))[0]:
    path = param_path(keypath)
    name = path.rsplit("/", 1)[-1]
    if name in lora_cfg.targets:
      split, ndim = KERNEL_DIMS[name]
      if len(leaf.shape) != ndim:  # e.g. stacked MoE experts [E, D, F]
        raise ValueError(f"lora.targets={lora_cfg.targets}: {path} has shape {leaf.shape}, not "
                         f"a dense {ndim}-d kernel; drop {name!r} from lora.targets")
      found[path] = (math.prod(leaf.shape[:split]), math.prod(leaf.shape[split:]))
  missing = [t for t in lora_cfg.targets if not any(p.endswith("/" + t) for p in found)]
  if missing:
    raise ValueError(f"lora.targets={lora_cfg.targets}: {missing} match no kernel of this model; "
                     "drop them")
  return found


def _nest(flat: dict[str, dict]) -> Params:
  """{"layers/0/attn/q_proj": v} -> {"layers": {0: {"attn": {"q_proj": v}}}} (digits -> int,
  like the params' layer indices)."""
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    *parents, last = [int(p) if p.isdigit() else p for p in path.split("/")]
    for key in parents:
      node = node.setdefault(key, {})
    node[last] = value
  return tree


def flat_adapters(tree: Params) -> dict[str, dict]:
  """Inverse of `_nest`: an adapters tree as: {param path: {"a": A, "b": B}}."""
  out: dict[str, dict] = {}
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    path = param_path(keypath)
    parent, _, which = path.rpartition("/")
    out.setdefault(parent, {})[which] = leaf
  return out


def _init(model_cfg: ModelConfig, lora_cfg: LoraConfig, rng: jax.Array) -> Params:
  paths = adapter_paths(model_cfg, lora_cfg)
  keys = jax.random.split(rng, len(paths))
  flat = {}
  for key, (path, (fan_in, fan_out)) in zip(keys, paths.items()):
    bound = 1.0 / math.sqrt(fan_in)
    flat[path] = {"a": jax.random.uniform(key, (fan_in, lora_cfg.rank), jnp.float32, -bound, bound),
                  "b": jnp.zeros((lora_cfg.rank, fan_out), jnp.float32)}
  return _nest(flat)


def init_adapters(model_cfg: ModelConfig, lora_cfg: LoraConfig, rng: jax.Array) -> Params:
  """Fresh adapters: A kaiming-uniform, B = 0 (so the merged model is the base)."""
  return _jitted_init(model_cfg, lora_cfg)(rng)


@functools.lru_cache(maxsize=None)
def _jitted_init(model_cfg: ModelConfig, lora_cfg: LoraConfig):
  return jax.jit(functools.partial(_init, model_cfg, lora_cfg))


def abstract_adapters(model_cfg: ModelConfig, lora_cfg: LoraConfig) -> Params:
  """Shapes and dtypes of the adapters, allocating nothing."""
  return jax.eval_shape(functools.partial(_init, model_cfg, lora_cfg), jax.random.key(0))


def delta(a_IxR: jax.Array, b_RxO: jax.Array, shape: tuple[int, ...], scale: float) -> jax.Array:
  """s * A B in float32, reshaped to the kernel's `shape`."""
  return (scale * (a_IxR.astype(jnp.float32) @ b_RxO.astype(jnp.float32))).reshape(shape)


def merge(base: Params, adapters: Params, lora_cfg: LoraConfig) -> Params:
  """`base` with each targeted kernel W replaced by W + s A B (in W's dtype)."""
  flat = flat_adapters(adapters)

  def one(keypath, w):
    ab = flat.get(param_path(keypath))
    if ab is None:
      return w
    return (w.astype(jnp.float32) + delta(ab["a"], ab["b"], w.shape, lora_cfg.scale)).astype(w.dtype)

  return jax.tree_util.tree_map_with_path(one, base)
