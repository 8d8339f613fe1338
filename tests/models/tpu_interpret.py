"""`interpret()`: jax's TPU interpret mode (Pallas TPU kernels run on CPU), with ref
reshapes and bitcasts.

jax 0.10.2's TPU interpreter reads a ref through its index transforms only
(`interpret/utils.py: to_range`) and fails on the ragged paged attention kernel,
which reshapes its VMEM page buffer before strided reads
(`AttributeError: 'ReshapeTransform' object has no attribute 'indices'`). Inside
`interpret()` a read whose transforms include a reshape reads the buffer up to
the reshape through the interpreter (bounds and race checks as usual), then
reshapes and indexes the copy in numpy. Only reads: the kernel writes no
reshaped ref. A bitcast to a wider type (the kernel reads a bfloat16 pool as
uint32 to split keys from values) packs pairs along the second-minor axis, as
TPU memory does: uint32 [i, h] holds rows 2i (low half) and 2i + 1 (high half).

A second bug: a masked store checks every dimension's bound against the first
one (`shared_memory.swap_buffer_content` slices `in_bounds_mask[bound:]` for
each dimension), so a store into the kernel's [queries per block, query heads
per KV head, H] accumulator fails ("Out-of-bounds masked swap") when the block
has more query rows than that group, as a prefill's do. Inside `interpret()` a
masked store whose range lies wholly in its buffer (no bound to check) is made
unmasked: the value where the mask is set, the buffer's content elsewhere.
Other stores (unmasked, or reaching past the buffer) go to the interpreter as
they are.
"""

import contextlib

import jax
import numpy as np
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpreter
from jax._src.pallas.mosaic.interpret import shared_memory
from jax._src.pallas.mosaic.interpret import utils as interpreter_utils
from jax._src.state.types import BitcastTransform, ReshapeTransform
from jax.experimental.pallas import tpu as pltpu

_get = tpu_interpreter.get.__wrapped__  # the DMA engine calls the undecorated function
_swap = shared_memory.SharedMemory.swap_buffer_content


def _bitcast_second_minor(value: np.ndarray, dtype) -> np.ndarray:
  """[..., R, H] -> [..., R / ratio, H] of the wider `dtype`, `ratio` rows per element."""
  ratio = np.dtype(dtype).itemsize // value.dtype.itemsize
  if ratio < 1 or value.shape[-2] % ratio:
    raise NotImplementedError(f"bitcast {value.dtype}{value.shape} -> {np.dtype(dtype)}")
  *lead, rows, h = value.shape
  packed = value.reshape(*lead, rows // ratio, ratio, h).swapaxes(-1, -2)
  return np.ascontiguousarray(packed).view(dtype)[..., 0]  # little-endian: row 0 lowest


def _get_through_reshapes(token, device_id, local_core_id, memory_space, buffer_id, transforms,
                          *args, **kwargs):
  first = next((i for i, t in enumerate(transforms)
                if isinstance(t, (ReshapeTransform, BitcastTransform))), None)
  if first is None:
    return _get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args,
                **kwargs)
  token, value = _get(token, device_id, local_core_id, memory_space, buffer_id,
                      transforms[:first], *args, **kwargs)
  value = np.asarray(value)
  for transform in jax.tree.map(int, transforms[first:]):
    if isinstance(transform, ReshapeTransform):
      value = value.reshape(transform.shape)
    elif isinstance(transform, BitcastTransform):
      value = _bitcast_second_minor(value, transform.dtype)
    else:  # an NDIndexer: integers and (start, size, stride) slices
      value = value[tuple(interpreter_utils._transform_slice_or_index(index)
                          for index in transform.indices)]
  return token, value


def _swap_masked_in_bounds(self, key, rnge, value, mask, *args, **kwargs):
  """`SharedMemory.swap_buffer_content`, a masked swap wholly in bounds done unmasked."""
  if mask is not None:
    try:
      with self.lock:
        old = np.array(self.mem[key][rnge])
    except IndexError:  # wholly out of bounds: the interpreter's error
      old = None
    if old is not None and old.shape == value.shape:
      result, shape_and_dtype, clock = _swap(self, key, rnge, np.where(mask, value, old), None,
                                             *args, **kwargs)
      # The masked swap's return: the old content where the mask is set, else the value.
      return np.where(mask, result, value), shape_and_dtype, clock
  return _swap(self, key, rnge, value, mask, *args, **kwargs)


@contextlib.contextmanager
def interpret():
  """Pallas TPU kernels traced inside run in TPU interpret mode (module docstring)."""
  original = tpu_interpreter.get
  tpu_interpreter.get = tpu_interpreter.fail_on_exception(_get_through_reshapes)
  shared_memory.SharedMemory.swap_buffer_content = _swap_masked_in_bounds
  try:
    with pltpu.force_tpu_interpret_mode():
      yield
  finally:
    tpu_interpreter.get = original
    shared_memory.SharedMemory.swap_buffer_content = _swap
