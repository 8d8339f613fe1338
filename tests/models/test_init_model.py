"""A checkpoint directory is enough (`sao_jax.config.init_model`): with `run.init=DIR`
every model field left at its default comes from DIR's config.json, the tokenizer
from DIR; fields the config sets must agree; bad directories are refused by name."""

import dataclasses
import json
import pathlib
import types

import pytest

from sao_jax.config import ModelConfig, hf_json, init_model, load_config, params_json
from sao_jax.models import params_io, tokenizer as tokenizer_lib
from sao_jax.models.transformer import init_params
from tiny import build_hf

CONFIGS = pathlib.Path(__file__).parents[2] / "configs"
FROM_HF = CONFIGS / "from_hf.py"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
  """A tiny random Llama-3 checkpoint (llama3 RoPE, tied) saved by transformers, with a
  tokenizer.json beside it."""
  path = tmp_path_factory.mktemp("llama")
  build_hf("llama").save_pretrained(path)
  tokenizer_lib.train_tokenizer(["a b c 1 2 3"], 256).save(str(path / "tokenizer.json"))
  return path


def test_a_ten_line_config_takes_the_whole_model_section_from_the_checkpoint(llama_dir):
  assert len(FROM_HF.read_text().split('"""')[-1].strip().splitlines()) <= 10
  cfg = load_config(FROM_HF, [f"run.init={llama_dir}"])
  expected = hf_json.config_from_hf(llama_dir)
  for name in init_model.ARCHITECTURE_FIELDS:
    assert getattr(cfg.model, name) == getattr(expected, name), name
  assert (cfg.model.family, cfg.model.vocab_size, cfg.model.rope_type) == ("llama", 256, "llama3")
  assert cfg.model.rope_factor == 8.0 and cfg.model.tie_word_embeddings
  assert cfg.run.tokenizer == str(llama_dir)
  assert init_model.resolve(cfg) == cfg  # idempotent: jobs resolve again


def test_runtime_fields_and_a_set_tokenizer_stay_as_configured(llama_dir, tmp_path):
  cfg = load_config(FROM_HF, [f"run.init={llama_dir}", "model.attention_impl=blocked",
                              "model.remat_policy=full", f"run.tokenizer={tmp_path}"])
  assert cfg.model.attention_impl == "blocked" and cfg.model.remat_policy == "full"
  assert cfg.run.tokenizer == str(tmp_path)


def test_fields_the_config_sets_must_agree_with_the_checkpoint(llama_dir):
  agreeing = load_config(FROM_HF, [f"run.init={llama_dir}", "model.family=llama",
                                   "model.hidden_size=32"])
  assert agreeing.model.hidden_size == 32
  with pytest.raises(ValueError) as error:
    load_config(FROM_HF, [f"run.init={llama_dir}", "model.hidden_size=48",
                          "model.family=qwen3"])
  # family qwen3 is the default (so it is read), hidden_size 48 is not: both values named.
  assert "model.hidden_size=48 but the checkpoint has 32" in str(error.value)
  assert "family" not in str(error.value)


def test_a_setting_that_describes_the_same_weights_is_no_conflict(llama_dir):
  """MoE fields mean nothing for a dense checkpoint: setting them is accepted."""
  cfg = load_config(FROM_HF, [f"run.init={llama_dir}", "model.num_experts_per_tok=1"])
  assert cfg.model.family == "llama" and cfg.model.num_experts == 0


def test_a_params_directory_resolves_like_a_hf_one(llama_dir, tmp_path):
  """A sao-convert params directory (what experiments.warm_start writes) resolves too."""
  model = hf_json.config_from_hf(llama_dir)
  params_dir = tmp_path / "params"
  params_io.save_params(params_dir, init_params(model, __import__("jax").random.key(0)), model)
  cfg = load_config(FROM_HF, [f"run.init={params_dir}", "model.family=llama",
                              f"model.vocab_size={model.vocab_size}"])
  assert init_model.architecture(cfg.model) == init_model.architecture(model)
  assert cfg.run.tokenizer == ""  # a params directory ships no tokenizer


def test_the_old_name_model_hf_path_points_to_run_init(tmp_path):
  with pytest.raises(ValueError, match=r"model.hf_path is now run.init; set --set run.init=/x"):
    load_config(FROM_HF, ["model.hf_path=/x"])
  config = tmp_path / "old.py"
  config.write_text("from sao_jax.config import Config, ModelConfig\n"
                    "def get_config():\n  return Config(model=ModelConfig(hf_path='/x'))\n")
  with pytest.raises(ValueError, match=r"model.hf_path is now run.init"):
    load_config(config)
  legacy = tmp_path / "legacy"  # a params directory written when the field existed
  model = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, head_dim=4)
  params_io.save_params(legacy, init_params(model, __import__("jax").random.key(0)), model)
  fields = json.loads((legacy / params_json.CONFIG_FILE).read_text())
  (legacy / params_json.CONFIG_FILE).write_text(json.dumps({**fields, "hf_path": None}))
  assert params_json.load_model_config(legacy)[0] == model


def test_bad_directories_are_refused_naming_the_fix(llama_dir, tmp_path):
  def refused(directory, *phrases):
    cfg = load_config(CONFIGS / "tiny_cpu.py")
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, init=str(directory)))
    with pytest.raises((ValueError, FileNotFoundError)) as error:
      init_model.check_init(cfg)
    for phrase in phrases:
      assert phrase in str(error.value)

  refused(tmp_path / "missing", "is not a directory", "huggingface-cli download")
  empty = tmp_path / "empty"
  empty.mkdir()
  refused(empty, "holds neither config.json nor model_config.json")
  no_weights = tmp_path / "no_weights"
  no_weights.mkdir()
  (no_weights / "config.json").write_text((llama_dir / "config.json").read_text())
  (no_weights / "pytorch_model.bin").write_bytes(b"")
  refused(no_weights, "no *.safetensors weights", "pytorch_model.bin", "safetensors")
  other = tmp_path / "other"
  other.mkdir()
  (other / "model.safetensors").write_bytes((llama_dir / "model.safetensors").read_bytes())
  (other / "config.json").write_text(json.dumps(
      {**json.loads((llama_dir / "config.json").read_text()),
       "architectures": ["MistralForCausalLM"]}))
  refused(other, "MistralForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM",
          "Gemma3ForCausalLM")
  # load_config refuses the unsupported architecture too (the directory exists).
  with pytest.raises(ValueError, match="MistralForCausalLM"):
    load_config(FROM_HF, [f"run.init={other}"])


def test_a_dtype_the_hardware_lacks_is_refused():
  bf16 = ModelConfig(param_dtype="bfloat16", compute_dtype="bfloat16")
  v100 = types.SimpleNamespace(platform="gpu", compute_capability="7.0", device_kind="Tesla V100")
  a100 = types.SimpleNamespace(platform="gpu", compute_capability="8.0", device_kind="A100")
  cpu = types.SimpleNamespace(platform="cpu")
  with pytest.raises(ValueError, match=r"model.param_dtype='bfloat16' but Tesla V100 .*"
                     r"--set model.param_dtype=float32 and --set model.compute_dtype=float32"):
    init_model.check_dtypes(bf16, [v100])
  init_model.check_dtypes(bf16, [a100, cpu])
  init_model.check_dtypes(ModelConfig(), [v100])  # float32 runs anywhere
