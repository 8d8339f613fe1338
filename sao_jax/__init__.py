"""sao_jax: JAX/TPU-native Single-Rollout Asynchronous Optimization (SAO)."""

__version__ = "0.1.0"
