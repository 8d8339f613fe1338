"""`python -m sao_jax.config CONFIG [--set a.b=c ...]` prints the resolved config."""

from sao_jax.config.loading import main

main()
