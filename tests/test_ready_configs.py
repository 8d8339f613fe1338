"""Ready-made configs for small real checkpoints (configs/qwen3_0_6b.py, qwen3_1_7b.py,
qwen3_4b.py, qwen2_5_0_5b.py, llama3_2_1b.py, llama3_2_3b.py, gemma3_1b.py, gemma3_4b.py):
they validate, their `model` section is what `config_from_hf` reads from the checkpoint's
config.json (so `--set run.init=<that directory>` is accepted), and (slow) sao-plan's
programs lower at full size on the CPU mesh. The single-host ones carry sao-plan's figures
for each ready host in their docstrings (`figures`); with libtpu, each is compiled as
`sao-plan --config FILE:HOST` does and must fit and give those figures, and the README's
table must repeat them."""

import ast
import pathlib
import re

import pytest

from sao_jax.config.loading import load_config
from sao_jax.config import hf_json, hosts
from sao_jax.planning import aot, estimate
from sao_jax.sharding.mesh import make_mesh

CONFIGS = pathlib.Path(__file__).parents[1] / "configs"
README = pathlib.Path(__file__).parents[1] / "README.md"
# The single-host configs and the name the README gives each.
SINGLE_HOST = {"qwen3_0_6b.py": "Qwen3-0.6B", "qwen3_1_7b.py": "Qwen3-1.7B",
               "qwen3_4b.py": "Qwen3-4B", "llama3_2_1b.py": "Llama-3.2-1B",
               "llama3_2_3b.py": "Llama-3.2-3B", "gemma3_4b.py": "Gemma-3-4B"}

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
    "qwen3_1_7b.py": {  # Qwen/Qwen3-1.7B
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
    "qwen3_4b.py": {  # Qwen/Qwen3-4B
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 9728,
        "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
        "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
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
    "llama3_2_3b.py": {  # meta-llama/Llama-3.2-3B
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 24, "num_hidden_layers": 28, "num_key_value_heads": 8,
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
    # google/gemma-3-4b-it is multimodal (Gemma3ForConditionalGeneration): its
    # text_config, as published (the other fields are Gemma3TextConfig's defaults), is
    # the config.json of its language model saved on its own as a Gemma3ForCausalLM.
    "gemma3_4b.py": {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
        "torch_dtype": "bfloat16"},
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


_PROGRAM_ROW = re.compile(r"^ {4}(\S+) +(train_step|decode_step|paged_decode) +\S+ +\S+ +"
                          r"([0-9.]+) +([0-9.]+)$")
_ROOFLINE_ROW = re.compile(r"^ {4}(\S+) +roofline: MFU <= ([0-9.]+%), train tokens/s <= "
                           r"([0-9,]+), paged decode tokens/s <= ([0-9,]+)$")


def figures(name: str) -> dict[str, dict]:
  """The sao-plan figures in configs/`name`'s docstring, per host: {"programs":
  {program: total GiB per device}, "hbm": GiB, "mfu": "74.0%", "train_tokens_s":
  "188,243", "paged_tokens_s": "73,104"}."""
  text = load_module_docstring(CONFIGS / name)
  found: dict[str, dict] = {}
  for line in text.splitlines():
    if match := _PROGRAM_ROW.match(line):
      host = found.setdefault(match[1], {"programs": {}})
      host["programs"][match[2]] = float(match[3])
      host["hbm"] = float(match[4])
    elif match := _ROOFLINE_ROW.match(line):
      found.setdefault(match[1], {"programs": {}}).update(
          mfu=match[2], train_tokens_s=match[3], paged_tokens_s=match[4])
  return found


def load_module_docstring(path: pathlib.Path) -> str:
  return ast.get_docstring(ast.parse(path.read_text())) or ""


PLANNED = [(name, host) for name in SINGLE_HOST for host in figures(name)]


def test_every_single_host_config_states_its_figures_for_tpu_and_gpu_hosts():
  for name in SINGLE_HOST:
    stated = figures(name)
    assert {"v6e-8", "v5p-8"} <= set(stated), f"{name}: no TPU host figures"
    assert set(stated) <= set(hosts.HOSTS), f"{name}: figures for an unknown host"
    for host, figure in stated.items():
      assert set(figure["programs"]) == {"train_step", "decode_step", "paged_decode"}, (name, host)
      assert "mfu" in figure and "paged_tokens_s" in figure, (name, host)


def test_the_readme_table_repeats_the_configs_figures():
  """README rows: | model | host | learner / sampler GiB per device of HBM | MFU | paged
  decode tokens/s |, one per (config, host) the docstrings state, and no other (a GPU
  host's cell says it is an estimate)."""
  rows = {}
  for line in README.read_text().splitlines():
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    if len(cells) == 5 and cells[0] in SINGLE_HOST.values():
      host, _, note = cells[1].partition(" ")
      assert note == ("(estimate)" if hosts.host(host).platform == "gpu" else ""), cells[1]
      rows[(cells[0], host)] = cells[2:]
  expected = {}
  for name, model in SINGLE_HOST.items():
    for host, figure in figures(name).items():
      programs = figure["programs"]
      expected[(model, host)] = [
          f"{programs['train_step']:.2f} / {programs['paged_decode']:.2f} of {figure['hbm']:.2f}",
          figure["mfu"], figure["paged_tokens_s"]]
  assert rows == expected


@pytest.mark.slow
@pytest.mark.tpu_compile
@pytest.mark.parametrize("name, host", PLANNED)
def test_sao_plan_gives_the_figures_the_config_states(name, host):
  """What `sao-plan --config configs/NAME:HOST` compiles (the host's learner and sampler
  processes, GPU hosts on their TPU proxy): it fits, and the docstring's totals (GiB per
  device, to the printed 0.01), MFU and paged decode bound are what it gives."""
  pytest.importorskip("libtpu", reason="AOT planning for TPU needs libtpu: "
                      "pip install 'jax[tpu]==<jax version>'")
  cfg = load_config(f"{CONFIGS / name}:{host}")
  targets = aot.host_targets(cfg)
  result = aot.plan(cfg, targets.topology, cfg.sampler.max_seq_len,
                    sampler_topology=targets.sampler_topology, rate_as=targets.rate_as,
                    shared_device=targets.shared_device)
  aot.check_fits(result)
  stated = figures(name)[host]
  assert {p.name: round(p.memory.total / estimate.GiB, 2) for p in result.programs()} == \
      stated["programs"]
  assert f"{result.roofline.mfu:.1%}" == stated["mfu"]
  assert f"{result.roofline.tokens_per_s:,.0f}" == stated["train_tokens_s"]
  assert f"{aot.paged_decode(result).tokens_per_s:,.0f}" == stated["paged_tokens_s"]


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
