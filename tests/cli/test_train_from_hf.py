"""`sao-train --config configs/from_hf.py --set run.init=<HF dir>` trains: the model
section and tokenizer come from a checkpoint saved by transformers."""

import json
import pathlib

import pytest
import torch
import transformers

from sao_jax.cli import train as train_cli
from sao_jax.config import hf_json
from sao_jax.models import tokenizer as tokenizer_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
# CPU-sized run settings; nothing about the model.
SMALL_RUN = ["learner.batch_trajectories=8", "learner.critic_warmup_steps=1", "learner.steps=2",
             "learner.value_pretrain_steps=0",
             "run.eval_every=0", "sampler.slots=4", "sampler.max_new_tokens=16",
             "sampler.max_seq_len=512", "sampler.prefill_buckets=(128, 512)",
             "data.length_buckets=(512,)", "env.max_turns=1"]


@pytest.mark.slow  # a compiled learner and a sampler process (~60 s on 2 cores)
def test_train_from_a_hugging_face_directory(tmp_path, capsys):
  model_dir = tmp_path / "Qwen3-tiny"
  config = transformers.Qwen3Config(vocab_size=384, hidden_size=32, intermediate_size=64,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8,
                                    max_position_embeddings=512, tie_word_embeddings=True)
  torch.manual_seed(0)
  transformers.Qwen3ForCausalLM(config).save_pretrained(model_dir)
  tokenizer_lib.train_tokenizer(["What is 2 + 3? \\boxed{5} python print"], 384).save(
      str(model_dir / "tokenizer.json"))
  run_dir = tmp_path / "run"
  args = ["--config", str(ROOT / "configs" / "from_hf.py"), "--set", f"run.init={model_dir}",
          "--set", f"run.run_dir={run_dir}"]
  train_cli.main(args + [a for o in SMALL_RUN for a in ("--set", o)])
  out = capsys.readouterr().out
  assert "done: 2 steps" in out
  assert f"model section (run.init={model_dir}" in out and '"hidden_size": 32' in out
  saved = json.loads((run_dir / "config.json").read_text())
  assert saved["model"]["family"] == "qwen3" and saved["model"]["vocab_size"] == 384
  assert saved["run"]["tokenizer"] == str(model_dir)
  assert {k: saved["model"][k] for k in ("hidden_size", "head_dim", "rope_theta")} == {
      "hidden_size": 32, "head_dim": 8, "rope_theta": hf_json.config_from_hf(model_dir).rope_theta}
  rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "reward/mean" in r] == [0, 1]
