"""NF4 (4-bit NormalFloat, QLoRA) block quantisation of a [in, out] kernel.

Each row is split into blocks of `block` consecutive values (block divides out).
With m = max |w| over a block, every value is stored as the index of the NF4 level
nearest to w / m (ties to the lower level) and restored as

    w ~ NF4[code] * m

NF4 holds the 16 quantiles of N(0, 1) scaled to [-1, 1] with an exact 0 (Dettmers et
al. 2023, the table of bitsandbytes). Two codes share a byte (first in the high
nibble), and m is float32, so a block of 64 takes 32 + 4 bytes: 0.5625 bytes a
value against 2 for bfloat16. (QLoRA's double quantisation of m is not done.)

  quantize(w_IxO, block) -> {"nf4_codes": uint8 [in, out/2],
                              "nf4_absmax": float32 [in, out/block]}
  dequantize(q, dtype)   -> w_IxO
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
KEYS = ("nf4_codes", "nf4_absmax")


def is_quantized(node) -> bool:
  """Whether a params-tree node is a `quantize` result (a dict of the two arrays)."""
  return isinstance(node, dict) and set(node) == set(KEYS)


def quantize(w_IxO: jax.Array, block: int) -> dict[str, jax.Array]:
  """NF4 codes (packed two a byte) and float32 block maxima of `w_IxO` (module docstring)."""
  rows, cols = w_IxO.shape
  if cols % block or block % 2:
    raise ValueError(f"nf4: a kernel with {cols} output values does not split into blocks of "
                     f"{block}; set lora.quant_block to an even divisor of {cols}")
  w_IxBxK = w_IxO.astype(jnp.float32).reshape(rows, cols // block, block)
  absmax_IxB = jnp.max(jnp.abs(w_IxBxK), axis=-1)
  normed = w_IxBxK / jnp.where(absmax_IxB > 0, absmax_IxB, 1.0)[..., None]
  # Nearest level: the count of midpoints below the value (a tie goes to the lower level).
  midpoints = jnp.asarray((NF4_LEVELS[1:] + NF4_LEVELS[:-1]) / 2)
  codes_IxO = jnp.searchsorted(midpoints, normed.reshape(rows, cols), side="left").astype(jnp.uint8)
  packed = (codes_IxO[:, 0::2] << 4) | codes_IxO[:, 1::2]
  return {"nf4_codes": packed, "nf4_absmax": absmax_IxB}


def dequantize(q: dict[str, jax.Array], dtype) -> jax.Array:
  """w_IxO = NF4[code] * block max, in `dtype`."""
  packed, absmax_IxB = q["nf4_codes"], q["nf4_absmax"]
  rows, blocks = absmax_IxB.shape
  codes_IxO = jnp.stack([packed >> 4, packed & 15], axis=-1).reshape(rows, -1)
  levels = jnp.asarray(NF4_LEVELS)[codes_IxO.astype(jnp.int32)]
  w = levels.reshape(rows, blocks, -1) * absmax_IxB[..., None]
  return w.reshape(rows, -1).astype(dtype)
