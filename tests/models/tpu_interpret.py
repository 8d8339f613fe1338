"""`interpret()`: jax's TPU interpret mode (Pallas TPU kernels run on CPU), with ref
reshapes.

jax 0.10.2's TPU interpreter reads a ref through its index transforms only
(`interpret/utils.py: to_range`) and fails on the ragged paged attention kernel,
which reshapes its VMEM page buffer before strided reads
(`AttributeError: 'ReshapeTransform' object has no attribute 'indices'`). Inside
`interpret()` a read whose transforms include a reshape reads the buffer up to
the reshape through the interpreter (bounds and race checks as usual), then
reshapes and indexes the copy in numpy. Only reads: the kernel writes no
reshaped ref.

A second bug of that interpreter is left alone: a masked store checks every
dimension's bound against the first one (`shared_memory.swap_buffer_content`
slices `in_bounds_mask[bound:]` for each dimension), so a store into the
kernel's [queries per block, query heads per KV head, H] accumulator fails
("Out-of-bounds masked swap") when the block has more query rows than that
group. Tests keep a call's rows (one query block off a TPU, up to 32) at most
num_attention_heads / num_key_value_heads.
"""

import contextlib

import jax
import numpy as np
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpreter
from jax._src.pallas.mosaic.interpret import utils as interpreter_utils
from jax._src.state.types import ReshapeTransform
from jax.experimental.pallas import tpu as pltpu

_get = tpu_interpreter.get.__wrapped__  # the DMA engine calls the undecorated function


def _get_through_reshapes(token, device_id, local_core_id, memory_space, buffer_id, transforms,
                          *args, **kwargs):
  first = next((i for i, t in enumerate(transforms) if isinstance(t, ReshapeTransform)), None)
  if first is None:
    return _get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args,
                **kwargs)
  token, value = _get(token, device_id, local_core_id, memory_space, buffer_id,
                      transforms[:first], *args, **kwargs)
  value = np.asarray(value)
  for transform in jax.tree.map(int, transforms[first:]):
    if isinstance(transform, ReshapeTransform):
      value = value.reshape(transform.shape)
    else:  # an NDIndexer: integers and (start, size, stride) slices
      value = value[tuple(interpreter_utils._transform_slice_or_index(index)
                          for index in transform.indices)]
  return token, value


@contextlib.contextmanager
def interpret():
  """Pallas TPU kernels traced inside run in TPU interpret mode (module docstring)."""
  original = tpu_interpreter.get
  tpu_interpreter.get = tpu_interpreter.fail_on_exception(_get_through_reshapes)
  try:
    with pltpu.force_tpu_interpret_mode():
      yield
  finally:
    tpu_interpreter.get = original
