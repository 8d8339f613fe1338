"""NF4 (4-bit NormalFloat, QLoRA) block quantisation, laid out as bitsandbytes does.

A targeted kernel is viewed as W [in, out]; its Hugging Face weight is the transpose
W^T [out, in]. bitsandbytes (`quantize_4bit(weight, blocksize, quant_type="nf4")`)
flattens that [out, in] weight row-major and splits it into blocks of `block`
consecutive values (the last block shorter when `block` does not divide out * in):
along the input dimension, crossing into the next row when `block` does not divide
in. With m = max |w| over a block, every value is stored as the index of the NF4
level nearest to w * (1 / m) in float32 (ties to the lower level: bitsandbytes'
decision tree tests `x > midpoint`) and restored as

    w ~ float32(NF4[code] * m), then cast to the params' dtype

so a base quantised here dequantises to exactly the weights bitsandbytes' Linear4bit
computes with (`tests/models/test_nf4.py`). An all-zero block has m = 0 and codes of
the exact level 0.0 (bitsandbytes' CUDA kernel writes code 0 there; both restore 0).

NF4 holds the 16 quantiles of N(0, 1) scaled to [-1, 1] with an exact 0 (Dettmers et
al. 2023, the table of bitsandbytes). Two codes of a row share a byte (the first in
the high nibble, bitsandbytes' packing), and m is float32, so a block of 64 takes
32 + 4 bytes: 0.5625 bytes a value against 2 for bfloat16. (QLoRA's double
quantisation of m is not done.)

  quantize(w_IxO, block) -> {"nf4_codes": uint8 [out, in/2],
                              "nf4_absmax": float32 [out, in/block] when block divides in,
                                            else [ceil(out * in / block)] (the flat blocks)}
  dequantize(q, block, dtype) -> w_IxO

The codes are bitsandbytes' packed bytes reshaped to rows (in is even), and the
scales its absmax vector, reshaped to rows when the blocks do not cross rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NF4_LEVELS = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)
# Float32 midpoints of adjacent levels: equal to the thresholds of bitsandbytes' tree.
_MIDPOINTS = (NF4_LEVELS[1:] + NF4_LEVELS[:-1]) / 2
KEYS = ("nf4_codes", "nf4_absmax")


def is_quantized(node) -> bool:
  """Whether a params-tree node is a `quantize` result (a dict of the two arrays)."""
  return isinstance(node, dict) and set(node) == set(KEYS)


def absmax_shape(in_dim: int, out_dim: int, block: int) -> tuple[int, ...]:
  """Shape of the scales of an [in, out] kernel: [out, in/block] when the blocks stay
  within rows of the [out, in] weight, else the flat count of blocks."""
  if in_dim % block == 0:
    return (out_dim, in_dim // block)
  return (-(-(in_dim * out_dim) // block),)


def quantize(w_IxO: jax.Array, block: int) -> dict[str, jax.Array]:
  """NF4 codes (packed two a byte) and float32 block maxima of `w_IxO`, blocked as
  bitsandbytes blocks the [out, in] weight (module docstring)."""
  in_dim, out_dim = w_IxO.shape
  if in_dim % 2:
    raise ValueError(f"nf4: a kernel with {in_dim} input values (odd) cannot pack two 4-bit "
                     "codes a byte along its rows; drop this projection from lora.targets or "
                     "set lora.base_quantization='none'")
  n = in_dim * out_dim
  blocks = -(-n // block)
  flat = w_IxO.astype(jnp.float32).T.reshape(n)
  # Zero padding leaves the last block's max |w| unchanged and is cut off below.
  w_BxK = jnp.pad(flat, (0, blocks * block - n)).reshape(blocks, block)
  absmax_B = jnp.max(jnp.abs(w_BxK), axis=-1)
  # bitsandbytes scales by the float32 reciprocal (x * (1/m), not x / m: they can
  # round apart); an all-zero block is scaled by 0 so its values stay 0.
  inverse_B = jnp.where(absmax_B > 0, 1.0 / jnp.where(absmax_B > 0, absmax_B, 1.0), 0.0)
  normed = (w_BxK * inverse_B[:, None]).reshape(-1)[:n]
  # Nearest level: the count of midpoints strictly below the value (ties to the lower).
  codes_OxI = jnp.searchsorted(jnp.asarray(_MIDPOINTS), normed, side="left").astype(
      jnp.uint8).reshape(out_dim, in_dim)
  packed = (codes_OxI[:, 0::2] << 4) | codes_OxI[:, 1::2]
  return {"nf4_codes": packed,
          "nf4_absmax": absmax_B.reshape(absmax_shape(in_dim, out_dim, block))}


def dequantize(q: dict[str, jax.Array], block: int, dtype) -> jax.Array:
  """w_IxO = float32(NF4[code] * block max), in `dtype`; `block` as `quantize` was given."""
  packed, absmax = q["nf4_codes"], q["nf4_absmax"]
  out_dim, in_dim = packed.shape[0], 2 * packed.shape[1]
  codes_OxI = jnp.stack([packed >> 4, packed & 15], axis=-1).reshape(out_dim, in_dim)
  levels = jnp.asarray(NF4_LEVELS)[codes_OxI.astype(jnp.int32)]
  if absmax.ndim == 2:  # blocks within rows
    w_OxI = (levels.reshape(out_dim, absmax.shape[1], -1) * absmax[..., None]).reshape(
        out_dim, in_dim)
  else:  # blocks of the flattened weight, the last one possibly short
    n = out_dim * in_dim
    padded = jnp.pad(levels.reshape(n), (0, absmax.shape[0] * block - n))
    w_OxI = (padded.reshape(-1, block) * absmax[:, None]).reshape(-1)[:n].reshape(out_dim, in_dim)
  return w_OxI.T.astype(dtype)
