"""Ready-made configs for small real checkpoints (configs/qwen3_0_6b.py, qwen2_5_0_5b.py,
llama3_2_1b.py, gemma3_1b.py): they validate, their `model` section is what `config_from_hf` reads
from the checkpoint's config.json (so `--set run.init=<that directory>` is accepted),
and (slow) sao-plan's programs lower at full size on the CPU mesh and, with libtpu,
fit a v5p host."""

import pathlib

import pytest

from sao_jax.config.loading import load_config
from sao_jax.config import hf_json
from sao_jax.sharding.mesh import make_mesh

CONFIGS = pathlib.Path(__file__).parents[1] / "configs"

# The checkpoints' own config.json files (Hugging Face Hub), as published.
CHECKPOINTS = {
    "qwen3_0_6b.py": {  # Qwen/Qwen3-0.6B
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
    "qwen2_5_0_5b.py": {  # Qwen/Qwen2.5-0.5B-Instruct
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896,
        "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
        "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 14,
        "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
        "vocab_size": 151936},
    "llama3_2_1b.py": {  # meta-llama/Llama-3.2-1B
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": 128256},
    "gemma3_1b.py": {  # google/gemma-3-1b-it
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
        "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
        "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
        "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
        "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": 262144},
}


def _architecture(model_cfg):
  """What `bootstrap.initial_policy` compares between run.init and the config."""
  return {k: v for k, v in hf_json.hf_config(model_cfg).items() if k != "dtype"}


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_config_validates_and_matches_its_checkpoint(name):
  cfg = load_config(CONFIGS / name)
  from_checkpoint = hf_json.config_from_hf(CHECKPOINTS[name])
  assert _architecture(cfg.model) == _architecture(from_checkpoint)
  assert cfg.model.param_dtype == from_checkpoint.param_dtype == "bfloat16"


@pytest.mark.slow
@pytest.mark.tpu_compile
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_sao_plan_fits_a_v5p_host(name):
  pytest.importorskip("libtpu", reason="AOT planning for TPU needs libtpu: "
                      "pip install 'jax[tpu]==<jax version>'")
  from sao_jax.planning import aot
  cfg = load_config(CONFIGS / name)
  result = aot.plan(cfg, "v5p:2x2x1", cfg.sampler.max_seq_len)
  aot.check_fits(result)


@pytest.mark.slow
@pytest.mark.tpu_compile
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_sao_plan_programs_lower_on_the_cpu_mesh(name):
  """What sao-plan compiles, lowered at full size without libtpu: the SAO train step
  and the sampler's decode step trace and shard for every family."""
  from sao_jax.planning import aot
  cfg = load_config(CONFIGS / name)
  mesh = make_mesh(cfg.mesh)
  assert "stablehlo" in aot.lower_train(cfg, mesh, 1024).as_text()[:20000]
  assert "stablehlo" in aot.lower_decode(cfg, mesh, 8, 1024).as_text()[:20000]
