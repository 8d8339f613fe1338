"""Qwen3-family policy and value models (flax nnx), their pure functional API,
KV-cache decoding, Hugging Face weight interop and the chat tokenizer."""
