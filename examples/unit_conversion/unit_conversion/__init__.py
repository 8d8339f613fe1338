"""Example sao_jax environment: convert a quantity between units with a `convert` tool."""
