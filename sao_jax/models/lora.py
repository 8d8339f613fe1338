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
  frozen_base(policy, model_cfg, lora_cfg) -> the base as held: policy, or NF4 (QLoRA)
  merge(base, adapters, lora_cfg, model_cfg) -> params with every targeted W replaced by W'
  base_shardings(model_cfg, lora_cfg, mesh)  -> NamedShardings of a frozen base

The adapters tree nests like the params (`adapters["layers"][0]["attn"]["q_proj"]
["a"]`), so orbax, the weight channels and `param_path` treat it as any params.
`merge` runs inside the jitted step (the learner differentiates the adapters
through it; the frozen base is a constant with no gradient) and in the sampler
when new adapters arrive. W' is stored in W's dtype: with a bfloat16 base the
forward sees bf16(W + s A B), exactly what a full fine-tune's bf16 weights see.

QLoRA (`lora.base_quantization="nf4"`): the targeted base kernels are held as NF4
codes (`frozen_base`), and W in W' is their dequantisation, NF4[code] * scale, in
bitsandbytes' layout (`sao_jax.models.nf4`), so W is what bitsandbytes' NF4 loads of
the same base hold and an exported adapter on such a base reproduces W'; the learner
and every sampler quantise the same base the same way, so both run the same W'.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from sao_jax.config import LoraConfig, ModelConfig
from sao_jax.models import nf4
from sao_jax.models.transformer import Params, abstract_params, param_path, param_shardings

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


def frozen_base(policy: Params, model_cfg: ModelConfig, lora_cfg: LoraConfig) -> Params:
  """The base as the learner and samplers hold it: `policy` itself, or with
  `lora.base_quantization="nf4"` (QLoRA) each targeted kernel replaced by its NF4
  codes and block maxima (`sao_jax.models.nf4`: bitsandbytes' blocks of the [out, in]
  weight)."""
  if not lora_cfg.quantized:
    return policy
  paths = adapter_paths(model_cfg, lora_cfg)

  def one(keypath, w):
    shape = paths.get(param_path(keypath))
    return w if shape is None else nf4.quantize(w.reshape(shape), lora_cfg.quant_block)

  return jax.tree_util.tree_map_with_path(one, policy)


def merge(base: Params, adapters: Params, lora_cfg: LoraConfig, model_cfg: ModelConfig) -> Params:
  """`base` (a `frozen_base`) with each targeted kernel W replaced by W + s A B, in
  the params' dtype; an NF4 kernel is dequantised first (W = NF4[code] * scale)."""
  flat = flat_adapters(adapters)
  kernels = {param_path(kp): leaf for kp, leaf in
             jax.tree_util.tree_flatten_with_path(abstract_params(model_cfg, "lm"))[0]}

  def one(keypath, w):
    path = param_path(keypath)
    ab = flat.get(path)
    if ab is None:
      return w
    kernel = kernels[path]
    if nf4.is_quantized(w):
      w = nf4.dequantize(w, lora_cfg.quant_block, kernel.dtype).reshape(kernel.shape)
    w_plus = w.astype(jnp.float32) + delta(ab["a"], ab["b"], w.shape, lora_cfg.scale)
    return w_plus.astype(w.dtype)

  return jax.tree_util.tree_map_with_path(one, base, is_leaf=nf4.is_quantized)


def base_shardings(model_cfg: ModelConfig, lora_cfg: LoraConfig, mesh: jax.sharding.Mesh) -> Params:
  """NamedShardings of a `frozen_base`: the params' (`param_shardings`); an NF4
  kernel's codes [out, in/2] and scales [out, in/block] (`nf4.quantize`) split their
  rows as the kernel's output and their columns as its input, where that is a
  contiguous split of the flattened dims (only the first of the kernel's output, or
  input, dims sharded: q_proj's heads, o_proj's heads) into whole bytes and whole
  blocks; otherwise that dim is replicated, as are flat scales (blocks crossing rows)."""
  shardings = param_shardings(model_cfg, mesh, "lm")
  if not lora_cfg.quantized:
    return shardings
  paths = adapter_paths(model_cfg, lora_cfg)
  mesh_shape = dict(mesh.shape)

  def contiguous(dims_spec):
    """The mesh axes of a group of dims when only its first dim is split, else None."""
    return dims_spec[0] if dims_spec and all(axis is None for axis in dims_spec[1:]) else None

  def fits(axes, size):
    """`axes` if they split `size` evenly, else None (that dim replicated)."""
    names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return axes if size % math.prod(mesh_shape[a] for a in names) == 0 else None

  def named(*spec):
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))

  def one(keypath, sharding):
    path = param_path(keypath)
    if path not in paths:
      return sharding
    in_dim, out_dim = paths[path]
    split, ndim = KERNEL_DIMS[path.rsplit("/", 1)[-1]]
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    rows, cols = contiguous(spec[split:]), contiguous(spec[:split])
    scales_shape = nf4.absmax_shape(in_dim, out_dim, lora_cfg.quant_block)
    scales = (named(rows, fits(cols, scales_shape[1])) if len(scales_shape) == 2
              else named(None))
    return {"nf4_codes": named(rows, fits(cols, in_dim // 2)), "nf4_absmax": scales}

  return jax.tree_util.tree_map_with_path(one, shardings)
