"""Model architecture and numerics."""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import check_choice, check_positive, fail

DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLS = ("dense", "blocked")
# Which activations a rematerialised decoder layer keeps for the backward pass
# (`sao_jax.models.transformer.REMAT_POLICIES` maps them to jax.checkpoint
# policies): "none" no remat (keep everything), "full" keep only the layer input,
# "dots_saveable" keep every matmul output, "dots_with_no_batch_dims_saveable"
# keep the weight matmuls' outputs but recompute attention scores.
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Qwen3-family decoder hyper-parameters (dense when `num_experts == 0`).

  Field names follow Hugging Face's `Qwen3Config` / `Qwen3MoeConfig` so a
  `config.json` maps onto them one to one. `hf_path`, when set, is a local
  Hugging Face directory whose config and weights replace these fields.
  """

  vocab_size: int = 512
  hidden_size: int = 64
  intermediate_size: int = 128
  num_hidden_layers: int = 2
  num_attention_heads: int = 4
  num_key_value_heads: int = 2
  head_dim: int = 16
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  max_position_embeddings: int = 4096
  tie_word_embeddings: bool = True
  # Mixture of experts (Qwen3-MoE). 0 experts means a dense SwiGLU MLP everywhere.
  num_experts: int = 0
  num_experts_per_tok: int = 2
  moe_intermediate_size: int = 64
  norm_topk_prob: bool = True
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  # Weight of the router's load-balancing loss in the policy loss (MoE only;
  # `sao_jax.models.moe.load_balancing_loss`); Qwen3-MoE checkpoints carry it in
  # config.json, and 0.001 is Qwen3-MoE's default.
  router_aux_loss_coef: float = 0.001
  # Numerics and memory.
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  logits_chunk: int = 1024  # tokens per LM-head chunk: bounds [B, chunk, vocab] memory
  # "blocked": flash-style attention, O(T * block) memory; "dense": materialises
  # [B, heads, T, T] float32 scores (the reference). Decoding is always dense.
  attention_impl: str = "dense"
  attention_block: int = 512  # query/key positions per block of blocked attention
  remat_policy: str = "none"
  # Run the decoder layers of a full forward (learner, evaluation) as one
  # `lax.scan` over their stacked params instead of unrolled: compile time and
  # program size stop growing with depth (a 48-layer MoE compiles in minutes, not
  # hours). Needs every layer to have the same structure (all dense or all MoE).
  # Decoding (KV cache) stays unrolled.
  scan_layers: bool = False
  hf_path: str | None = None

  def validate(self) -> None:
    check_positive("model", self, "vocab_size", "hidden_size", "intermediate_size",
                    "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "max_position_embeddings", "num_experts_per_tok",
                    "moe_intermediate_size", "decoder_sparse_step", "logits_chunk",
                    "attention_block")
    coef = self.router_aux_loss_coef
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not coef >= 0:
      fail("model", "router_aux_loss_coef", coef,
           "expected a number >= 0 (0 disables the MoE load-balancing loss)")
    if self.num_attention_heads % self.num_key_value_heads:
      fail("model", "num_key_value_heads", self.num_key_value_heads,
            f"must divide num_attention_heads={self.num_attention_heads}")
    if self.num_experts < 0:
      fail("model", "num_experts", self.num_experts, "expected 0 (dense) or a positive integer")
    if self.num_experts and self.num_experts_per_tok > self.num_experts:
      fail("model", "num_experts_per_tok", self.num_experts_per_tok,
            f"must be <= num_experts={self.num_experts}")
    if self.rope_theta <= 0:
      fail("model", "rope_theta", self.rope_theta, "expected a positive number")
    if self.rms_norm_eps <= 0:
      fail("model", "rms_norm_eps", self.rms_norm_eps, "expected a positive number")
    check_choice("model", self, "param_dtype", DTYPES)
    check_choice("model", self, "compute_dtype", DTYPES)
    check_choice("model", self, "attention_impl", ATTENTION_IMPLS)
    check_choice("model", self, "remat_policy", REMAT_POLICIES)
    if self.scan_layers and self.num_experts > 0 and (
        self.mlp_only_layers or self.decoder_sparse_step != 1):
      fail("model", "scan_layers", self.scan_layers,
           "needs identical layers, but mlp_only_layers / decoder_sparse_step mix dense and "
           "MoE layers; set scan_layers=False")
    bad_layers = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
    if bad_layers:
      fail("model", "mlp_only_layers", self.mlp_only_layers,
            f"layer indices must lie in [0, {self.num_hidden_layers})")
