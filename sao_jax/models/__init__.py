"""Decoder (Qwen3, Qwen2.5, Llama 3.x) policy and value models (flax nnx), their pure
functional API, KV-cache decoding, Hugging Face weight interop and the chat tokenizer."""
