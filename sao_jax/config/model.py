"""Model architecture and numerics."""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import check_choice, check_positive, fail
from sao_jax.config.families import FAMILIES

DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLS = ("dense", "blocked", "splash", "auto")
# Which activations a rematerialised decoder layer keeps for the backward pass
# (`sao_jax.models.transformer.REMAT_POLICIES` maps them to jax.checkpoint
# policies): "none" no remat (keep everything), "full" keep only the layer input,
# "dots_saveable" keep every matmul output, "dots_with_no_batch_dims_saveable"
# keep the weight matmuls' outputs but recompute attention scores.
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
# RoPE frequency rules (`sao_jax.models.rope`): transformers' rope_type names.
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# ModelConfig.layer_types entries (transformers' names): full causal attention, or
# causal attention to the `sliding_window` most recent positions (Gemma 3 local layers).
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Decoder hyper-parameters (dense when `num_experts == 0`).

  `family` selects the architecture (`sao_jax.config.families`: qwen3, qwen2,
  llama, gemma3). Field names follow Hugging Face's configs (`Qwen3Config`,
  `Qwen3MoeConfig`, ...) so a `config.json` maps onto them one to one; the
  `rope_*` fields are the entries of its `rope_parameters`. A run that starts
  from a checkpoint (`run.init`, the one name for it) reads every field left at
  its default from the checkpoint's config.json (`sao_jax.config.init_model`).
  """

  family: str = "qwen3"  # architecture family (sao_jax.config.families)

  vocab_size: int = 512  # tokens in the vocabulary (embedding and LM-head rows)
  hidden_size: int = 64  # width of the residual stream
  intermediate_size: int = 128  # width of the dense MLP's hidden layer
  num_hidden_layers: int = 2  # decoder layers
  num_attention_heads: int = 4  # query heads per layer
  # Key/value heads per layer (grouped-query attention; divides the query heads).
  num_key_value_heads: int = 2
  head_dim: int = 16  # width of one attention head
  rope_theta: float = 1_000_000.0  # RoPE base frequency (of the full_attention layers)
  # RoPE scaling (`sao_jax.models.rope` states the math of each type). rope_factor
  # is used by linear, llama3 and yarn; the original context length by llama3 and
  # yarn; low/high_freq_factor by llama3; beta_fast/slow, attention_factor (None:
  # 0.1 ln(factor) + 1) and truncate by yarn.
  rope_type: str = "default"  # RoPE frequency rule (transformers' rope_type)
  rope_factor: float = 1.0  # RoPE context-scaling factor (linear, llama3, yarn)
  # The context length the checkpoint was pre-trained at (llama3, yarn).
  rope_original_max_position_embeddings: int = 4096
  # Llama3 RoPE: wavelengths above original length / low_freq_factor are scaled fully.
  rope_low_freq_factor: float = 1.0
  # Llama3 RoPE: wavelengths below original length / high_freq_factor are not scaled.
  rope_high_freq_factor: float = 4.0
  # Yarn RoPE: rotations per context above which a dimension is not interpolated.
  rope_beta_fast: float = 32.0
  # Yarn RoPE: rotations per context below which a dimension is fully interpolated.
  rope_beta_slow: float = 1.0
  # Yarn RoPE: attention temperature (None: 0.1 ln(factor) + 1).
  rope_attention_factor: float | None = None
  # Yarn RoPE: round the correction range to whole dimensions (transformers' truncate).
  rope_truncate: bool = True
  # Local/global attention (family gemma3). layer_types: one LAYER_TYPES entry per
  # layer, () for all full_attention. A "sliding_attention" layer lets query
  # position p read key positions q with p - sliding_window < q <= p and rotates
  # with default RoPE of base rope_local_base_freq; the rope_* fields above are
  # those of the full_attention layers.
  layer_types: tuple[str, ...] = ()  # per-layer attention kind (Gemma 3); (): all full
  # Positions a sliding_attention layer reads (None: no local layers).
  sliding_window: int | None = None
  rope_local_base_freq: float = 10_000.0  # RoPE base of the sliding_attention layers (Gemma 3)
  # Attention scores are q.k * query_pre_attn_scalar^-1/2 (None: head_dim, the usual 1/sqrt(H)).
  query_pre_attn_scalar: float | None = None
  rms_norm_eps: float = 1e-6  # epsilon of every RMSNorm
  max_position_embeddings: int = 4096  # longest sequence the model is configured for
  tie_word_embeddings: bool = True  # the LM head reuses the embedding matrix
  # Mixture of experts (Qwen3-MoE). 0 experts means a dense SwiGLU MLP everywhere.
  num_experts: int = 0  # experts per MoE layer (0: a dense MLP everywhere)
  num_experts_per_tok: int = 2  # experts each token is routed to (top-k)
  moe_intermediate_size: int = 64  # hidden width of one expert's MLP
  norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum to 1
  decoder_sparse_step: int = 1  # every decoder_sparse_step-th layer is MoE, the rest dense
  mlp_only_layers: tuple[int, ...] = ()  # layer indices that keep a dense MLP in an MoE model
  # Weight of the router's load-balancing loss in the policy loss (MoE only;
  # `sao_jax.models.moe.load_balancing_loss`); Qwen3-MoE checkpoints carry it in
  # config.json, and 0.001 is Qwen3-MoE's default.
  router_aux_loss_coef: float = 0.001
  # Numerics and memory.
  param_dtype: str = "float32"  # dtype the parameters are stored in
  compute_dtype: str = "float32"  # dtype of activations and matmuls
  logits_chunk: int = 1024  # tokens per LM-head chunk: bounds [B, chunk, vocab] memory
  # Attention of a full forward (learner, scoring): "dense" materialises [B, heads,
  # T, T] float32 scores (the reference); "blocked" is flash-style pure JAX, O(T *
  # block) memory; "splash" is jax's Pallas splash kernel (TPU; interpreted on CPU),
  # an error where it cannot take the shapes; "auto" is splash on TPU where it can,
  # else blocked, saying why (`sao_jax.models.splash.choose`). Decoding is always dense.
  attention_impl: str = "dense"
  # Query/key positions per block of blocked and splash attention (splash: a
  # multiple of 128, at most splash.MAX_BLOCK).
  attention_block: int = 512
  remat_policy: str = "none"  # what a layer keeps for the backward pass (REMAT_POLICIES above)
  # Run the decoder layers of a full forward (learner, evaluation) as one
  # `lax.scan` over their stacked params instead of unrolled: compile time and
  # program size stop growing with depth (a 48-layer MoE compiles in minutes, not
  # hours). Needs every layer to have the same structure (all dense or all MoE).
  # Decoding (KV cache) stays unrolled.
  scan_layers: bool = False

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
    check_choice("model", self, "family", tuple(FAMILIES))
    check_choice("model", self, "rope_type", ROPE_TYPES)
    check_positive("model", self, "rope_original_max_position_embeddings")
    if self.rope_type != "default" and not self.rope_factor >= 1:
      fail("model", "rope_factor", self.rope_factor,
           f"rope_type={self.rope_type!r} needs a scaling factor >= 1")
    if (self.rope_type == "llama3"
        and not 0 < self.rope_low_freq_factor < self.rope_high_freq_factor):
      fail("model", "rope_low_freq_factor", self.rope_low_freq_factor,
           f"llama3 RoPE needs 0 < low_freq_factor < high_freq_factor={self.rope_high_freq_factor}")
    if self.rope_type == "yarn" and not 0 < self.rope_beta_slow < self.rope_beta_fast:
      fail("model", "rope_beta_slow", self.rope_beta_slow,
           f"yarn RoPE needs 0 < beta_slow < beta_fast={self.rope_beta_fast}")
    if self.rope_attention_factor is not None and not self.rope_attention_factor > 0:
      fail("model", "rope_attention_factor", self.rope_attention_factor,
           "expected a positive number, or None for yarn's 0.1 ln(factor) + 1")
    if self.num_experts and not FAMILIES[self.family].moe:
      fail("model", "num_experts", self.num_experts,
           f"family {self.family!r} has no mixture-of-experts variant; use family 'qwen3' or 0")
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
    self._validate_layer_types()
    bad_layers = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
    if bad_layers:
      fail("model", "mlp_only_layers", self.mlp_only_layers,
            f"layer indices must lie in [0, {self.num_hidden_layers})")

  def sliding_layer(self, index: int) -> bool:
    """Layer `index` attends within `sliding_window` (layer_types "sliding_attention")."""
    return bool(self.layer_types) and self.layer_types[index] == "sliding_attention"

  def _validate_layer_types(self) -> None:
    if self.layer_types:
      if len(self.layer_types) != self.num_hidden_layers:
        fail("model", "layer_types", self.layer_types,
             f"expected one entry per layer (num_hidden_layers={self.num_hidden_layers}), or ()")
      bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
      if bad:
        fail("model", "layer_types", self.layer_types,
             f"{bad} are not layer types; allowed values are {LAYER_TYPES}")
    sliding = any(self.sliding_layer(i) for i in range(self.num_hidden_layers))
    if sliding and not FAMILIES[self.family].gemma:
      fail("model", "layer_types", self.layer_types,
           f"family {self.family!r} has no sliding-window layers; use family 'gemma3' or "
           "all full_attention")
    window = self.sliding_window
    if sliding and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
      fail("model", "sliding_window", self.sliding_window,
           "sliding_attention layers need a positive window (tokens)")
    if sliding and self.scan_layers and len(set(self.layer_types)) > 1:
      fail("model", "scan_layers", self.scan_layers,
           "needs identical layers, but layer_types mixes sliding and full attention "
           "(different masks and RoPE bases); set scan_layers=False")
    if self.rope_local_base_freq <= 0:
      fail("model", "rope_local_base_freq", self.rope_local_base_freq, "expected a positive number")
    if self.query_pre_attn_scalar is not None and not self.query_pre_attn_scalar > 0:
      fail("model", "query_pre_attn_scalar", self.query_pre_attn_scalar,
           "expected a positive number, or None for head_dim")
    if self.query_pre_attn_scalar is not None and not FAMILIES[self.family].gemma:
      # Only Gemma's HF config has the field: export would drop it silently.
      fail("model", "query_pre_attn_scalar", self.query_pre_attn_scalar,
           f"family {self.family!r} scales attention by head_dim; set None (or family 'gemma3')")
