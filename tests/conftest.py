"""Test-wide JAX setup: 8 emulated CPU devices, strict numerics.

This must run before any JAX computation, which is why it lives here and not in
per-module XLA_FLAGS (those are order-dependent and break).
"""

import jax

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
