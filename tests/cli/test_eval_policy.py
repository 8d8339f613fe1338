"""`sao-eval --policy DIR`: the base model before RL (a Hugging Face directory) scored
with the same tool and table as a run's checkpoint, its params sharded over the
config's mesh rather than gathered on one device."""

import json
import pathlib

import pytest
import torch
import transformers

from sao_jax.cli import evaluate as evaluate_cli
from sao_jax.jobs import evaluate as evaluation
from sao_jax.models import tokenizer as tokenizer_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL = ["sampler.slots=8", "sampler.max_new_tokens=8", "sampler.max_seq_len=512",
         "sampler.prefill_buckets=(128, 512)", "env.max_turns=1"]


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
  path = tmp_path_factory.mktemp("Qwen3-tiny")
  config = transformers.Qwen3Config(vocab_size=384, hidden_size=32, intermediate_size=64,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8,
                                    max_position_embeddings=512, tie_word_embeddings=True)
  torch.manual_seed(0)
  transformers.Qwen3ForCausalLM(config).save_pretrained(path)
  tokenizer_lib.train_tokenizer(["What is 2 + 3? \\boxed{5}"], 384).save(str(path / "tokenizer.json"))
  return path


@pytest.mark.slow  # compiles a sampler engine (~40 s on 2 cores)
def test_the_base_model_is_scored_from_its_directory(base_model, tmp_path, capsys, monkeypatch):
  placed = []
  original = evaluation.benchmark

  def recording(cfg, chat, params, **kwargs):
    placed.append(len(params["embed"].sharding.device_set))
    return original(cfg, chat, params, **kwargs)

  monkeypatch.setattr(evaluation, "benchmark", recording)
  run_dir = tmp_path / "run"
  evaluate_cli.main(["--config", str(ROOT / "configs" / "from_hf.py"), "--policy", str(base_model),
                     "--episodes", "2", "--set", f"run.run_dir={run_dir}",
                     *[a for o in SMALL for a in ("--set", o)]])
  out = capsys.readouterr().out
  report = json.loads((run_dir / "eval" / f"policy_{base_model.name}.json").read_text())
  assert report["policy"] == str(base_model) and report["overall"]["tasks"] == 2
  assert 0.0 <= report["overall"]["greedy_pass@1"] <= 1.0
  assert f"policy {base_model}" in out and "greedy_pass@1" in out
  assert placed == [8]  # the embedding is spread over the 8-device mesh


def test_policy_and_step_are_exclusive(base_model, capsys):
  with pytest.raises(SystemExit) as exit_info:
    evaluate_cli.main(["--config", str(ROOT / "configs" / "from_hf.py"), "--policy",
                       str(base_model), "--step", "3"])
  assert exit_info.value.code == 2 and "--step picks a run checkpoint" in capsys.readouterr().err


def test_a_directory_that_holds_no_policy_is_refused(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    evaluate_cli.main(["--config", str(ROOT / "configs" / "from_hf.py"), "--policy",
                       str(tmp_path)])
  assert exit_info.value.code == 2 and "holds neither config.json" in capsys.readouterr().err
