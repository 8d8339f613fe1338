"""bitsandbytes' NF4 written out as a Python loop from its documented layout: the
independent reference of `sao_jax.models.nf4` (tests/models/test_nf4.py, test_lora.py)."""

import numpy as np

from sao_jax.models import nf4

# Float32 midpoints of adjacent levels, the thresholds of bitsandbytes' decision tree.
MIDPOINTS = [np.float32(np.float32(a) + np.float32(b)) / np.float32(2)
             for a, b in zip(nf4.NF4_LEVELS[:-1], nf4.NF4_LEVELS[1:])]


def nf4_reference(w_IxO, block):
  """bitsandbytes' NF4 of the HF weight W^T [out, in], a loop written from its layout:
  the weight flattened row-major, cut into blocks of `block` consecutive values (the
  last one shorter); m = max |x| over a block; x * float32(1 / m) is coded as the
  number of thresholds it exceeds (the nearest level, a tie to the lower); two codes
  a byte, the first in the high nibble.

  Returns (packed bytes [out * in / 2], absmax [blocks], codes and restored
  NF4[code] * m as [out, in])."""
  out_dim, in_dim = w_IxO.shape[1], w_IxO.shape[0]
  flat = np.ascontiguousarray(np.asarray(w_IxO, np.float32).T).reshape(-1)
  codes, restored, absmax = np.zeros(flat.size, np.uint8), np.zeros(flat.size, np.float32), []
  for start in range(0, flat.size, block):
    values = flat[start:start + block]
    m = np.float32(np.max(np.abs(values)))
    absmax.append(m)
    inverse = np.float32(1) / m if m > 0 else np.float32(0)
    for j, v in enumerate(values):
      x = np.float32(v * inverse)
      code = sum(1 for t in MIDPOINTS if x > t)
      codes[start + j] = code
      restored[start + j] = np.float32(nf4.NF4_LEVELS[code] * m)
  packed = (codes[0::2] << 4) | codes[1::2]
  return (packed, np.asarray(absmax, np.float32), codes.reshape(out_dim, in_dim),
          restored.reshape(out_dim, in_dim))
