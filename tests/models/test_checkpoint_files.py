"""Checkpoint files written by someone else (a hub download, a shared bucket): names and
sizes inside them must not make the loaders read elsewhere or hang. No torch needed:
the checkpoints are sao_jax's own HF export of a tiny random model."""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from sao_jax.config import hf_json, params_json
from sao_jax.models import hf, params_io, transformer

_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 32, "hidden_size": 16,
           "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 8, "dtype": "float32"}


@pytest.fixture(scope="module")
def model():
  cfg = hf_json.config_from_hf(_CONFIG)
  return cfg, transformer.init_params(cfg, jax.random.key(0))


def _export(model, out, **kwargs):
  hf.export_hf(model[1], model[0], out, **kwargs)
  return out


def test_index_cannot_name_a_shard_outside_the_checkpoint(model, tmp_path):
  """A sharded checkpoint whose index points one shard at `../elsewhere/...` (or an
  absolute path) would have the loader read any safetensors file on the host."""
  hf_dir = _export(model, tmp_path / "m", max_shard_bytes=4_000)
  index_file = hf_dir / "model.safetensors.index.json"
  index = json.loads(index_file.read_text())
  shard = sorted(set(index["weight_map"].values()))[0]
  (tmp_path / "elsewhere").mkdir()
  shutil.move(hf_dir / shard, tmp_path / "elsewhere" / shard)
  for outside in (f"../elsewhere/{shard}", str(tmp_path / "elsewhere" / shard)):
    weight_map = {name: outside if file == shard else file
                  for name, file in index["weight_map"].items()}
    index_file.write_text(json.dumps({**index, "weight_map": weight_map}))
    with pytest.raises(ValueError, match="not a plain file name inside the checkpoint"):
      hf.load_hf(hf_dir)


def test_config_with_absurd_layer_count_is_refused_before_building_layers(model, tmp_path):
  """config.json is read before the weights: 200 000 layers would build millions of
  per-layer entries (10**9 hangs) before the missing tensors were reported."""
  hf_dir = _export(model, tmp_path / "m")
  (hf_dir / "config.json").write_text(json.dumps({**_CONFIG, "num_hidden_layers": 200_000}))
  with pytest.raises(ValueError, match="num_hidden_layers=200000.*does not belong"):
    hf.load_hf(hf_dir)


def test_params_config_with_absurd_layer_count_is_refused(model, tmp_path):
  """The same for a sao_jax params directory: model_config.json is checked against the
  tensors stored before the per-layer param tree is built."""
  cfg, params = model
  params_io.save_params(tmp_path, params, cfg)
  fields = json.loads((tmp_path / params_json.CONFIG_FILE).read_text())
  (tmp_path / params_json.CONFIG_FILE).write_text(json.dumps({**fields,
                                                            "num_hidden_layers": 200_000}))
  with pytest.raises(ValueError, match="num_hidden_layers=200000"):
    params_io.load_params(tmp_path)


def test_params_config_with_unknown_field_is_named(model, tmp_path):
  cfg, params = model
  params_io.save_params(tmp_path, params, cfg)
  fields = json.loads((tmp_path / params_json.CONFIG_FILE).read_text())
  (tmp_path / params_json.CONFIG_FILE).write_text(json.dumps({**fields, "evil": 1}))
  with pytest.raises(ValueError, match=r"fields \['evil'\] that ModelConfig does not know"):
    params_json.load_model_config(tmp_path)


def test_deeply_nested_config_json_is_a_clear_error(tmp_path):
  """`json.loads` of 100 000 nested brackets raises RecursionError; the cap names the file."""
  (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
  with pytest.raises(ValueError, match="config.json: JSON nested 100000 deep"):
    hf_json.config_from_hf(tmp_path)


def test_integer_tensor_is_not_cast_into_a_weight(model, tmp_path):
  """A checkpoint holding an int tensor where a weight goes would load as garbage floats."""
  hf_dir = _export(model, tmp_path / "m")
  tensors = load_file(hf_dir / "model.safetensors")
  tensors["model.norm.weight"] = np.ones(tensors["model.norm.weight"].shape, np.int64)
  save_file(tensors, hf_dir / "model.safetensors")
  with pytest.raises(ValueError, match="'final_norm/scale' has dtype int64, expected a floating"):
    hf.load_hf(hf_dir)


def test_an_export_into_a_directory_holding_weights_is_refused(model, tmp_path):
  """transformers loads a `model.safetensors` before an index: a sharded export beside an
  older single-file one would load the old weights (before: written beside them)."""
  out = _export(model, tmp_path / "m")
  before = (out / "model.safetensors").read_bytes()
  with pytest.raises(ValueError, match=r"already holds weights \(model.safetensors\)"):
    _export(model, out, max_shard_bytes=4_000)
  assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
  assert (out / "model.safetensors").read_bytes() == before


def test_a_tokenizer_dir_without_a_tokenizer_is_refused_before_writing(model, tmp_path):
  """Before: a missing or tokenizer-less --tokenizer_dir exported without a tokenizer."""
  with pytest.raises(FileNotFoundError, match="tokenizer directory .*nope.* does not exist"):
    _export(model, tmp_path / "a", tokenizer_dir=tmp_path / "nope")
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="holds none of tokenizer.json"):
    _export(model, tmp_path / "b", tokenizer_dir=tmp_path / "empty")
  assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_failed_export_leaves_no_loadable_directory(model, tmp_path):
  """Before: config.json was written first, so a failure left a directory that looks
  like a checkpoint (config.json, temporary shards) but is not one."""
  cfg, params = model
  params = {name: value for name, value in params.items() if name != "final_norm"}
  with pytest.raises(ValueError, match="params lack 'final_norm"):
    hf.export_hf(params, cfg, tmp_path / "out", max_shard_bytes=4_000)
  assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("command", ["hf-to-sao", "sao-to-hf"])
def test_convert_cli_names_an_out_path_that_is_a_file(model, tmp_path, command):
  """Before: a FileExistsError traceback from mkdir."""
  from sao_jax.cli import convert

  source = _export(model, tmp_path / "hf")
  params_io.save_params(tmp_path / "sao", model[1], model[0])
  (tmp_path / "taken").write_text("x")
  source_flag = ["--hf_dir", str(source)] if command == "hf-to-sao" else [
      "--params", str(tmp_path / "sao")]
  with pytest.raises(SystemExit, match=r"sao-convert: output '.*taken' is a file; pass a dir"):
    convert.main([command, *source_flag, "--out", str(tmp_path / "taken")])


def test_a_missing_hf_dir_is_named_as_missing(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"HF checkpoint directory '.*nope' does not exist"):
    hf.load_hf(tmp_path / "nope")


@pytest.mark.parametrize("value", ["0", "-1", "1.5"])
def test_convert_cli_refuses_a_shard_size_below_one_mib(tmp_path, capsys, value):
  # Before: 0 or -1 was taken, and the export wrote one file per tensor.
  from sao_jax.cli import convert

  with pytest.raises(SystemExit) as exit_info:
    convert.main(["sao-to-hf", "--params", str(tmp_path), "--out", str(tmp_path / "hf"),
                  "--max-shard-mb", value])
  assert exit_info.value.code == 2
  assert f"--max-shard-mb: {value!r} is not a whole number of MiB >= 1" in capsys.readouterr().err


def _full_disk(monkeypatch):
  """safetensors' save_file as on a full disk: half a file, then its own error type."""
  from safetensors import SafetensorError

  def save_file(tensors, path, metadata=None):
    pathlib.Path(path).write_bytes(b"\0" * 8)
    raise SafetensorError("Error while serializing: I/O error: No space left on device")

  monkeypatch.setattr(params_io, "save_file", save_file)
  monkeypatch.setattr(hf, "save_file", save_file, raising=False)  # where it was imported before


@pytest.mark.parametrize("command", ["hf-to-sao", "sao-to-hf"])
def test_a_full_disk_is_one_line_and_leaves_no_whole_looking_directory(model, tmp_path,
                                                                       monkeypatch, command):
  """Before: a SafetensorError traceback, and hf-to-sao left model_config.json beside a
  truncated params.safetensors, which load_params took for a params directory."""
  from sao_jax.cli import convert

  source = _export(model, tmp_path / "hf")
  params_io.save_params(tmp_path / "sao", model[1], model[0])
  source_flag = ["--hf_dir", str(source)] if command == "hf-to-sao" else [
      "--params", str(tmp_path / "sao")]
  _full_disk(monkeypatch)
  with pytest.raises(SystemExit, match=r"sao-convert: cannot write '.*out.*': .*No space left"):
    convert.main([command, *source_flag, "--out", str(tmp_path / "out")])
  assert list((tmp_path / "out").iterdir()) == []
