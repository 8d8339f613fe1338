"""`sao-convert run-to-hf`: a run's checkpoint exported as a Hugging Face directory that
transformers loads with the run's tokenizer and chat template, so that
`apply_chat_template` on the export gives, token for token, what the run's own chat
format encoded; the value model to its own params directory; a LoRA run merged and
as a PEFT directory. Each run here is a checkpoint saved from a step-0 state (what
the export reads is the checkpoint, not how training produced it)."""

import dataclasses
import json

import jax
import numpy as np
import pytest
import transformers

from chat_fixtures import build_tokenizer_dir
from sao_jax import config as C
from sao_jax.chat.format import CHATML_TEMPLATE
from sao_jax.cli import convert as convert_cli
from sao_jax.config import hf_json
from sao_jax.jobs import export
from sao_jax.learner import state as state_lib
from sao_jax.models import hf, params_io
from sao_jax.run import bootstrap
from sao_jax.run.checkpoint import Checkpointer

ARCHITECTURE = {"qwen3": "Qwen3ForCausalLM", "llama3_2": "LlamaForCausalLM",
                "gemma3": "Gemma3ForCausalLM"}
SIZES = {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
         "max_position_embeddings": 256}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What is 2 + 2?"}
# (messages, add_generation_prompt): a prompt as the export would be served it, and an
# episode's last turn. (Templates that rewrite earlier turns, as Qwen3 drops their
# reasoning, differ from an episode's tokens there by design: tests/chat/test_format.py.)
CONVERSATIONS = [([SYSTEM, USER], True),
                 ([SYSTEM, USER, {"role": "assistant", "content": "The answer is 4."}], False)]


def run_config(run_dir, family, tokenizer_dir, *, lora=False) -> C.Config:
  """A run of a tiny `family` model trained with the tokenizer in `tokenizer_dir`."""
  model = hf_json.config_from_hf({"architectures": [ARCHITECTURE[family]], **SIZES,
                                  "dtype": "float32"})
  algorithm = C.AlgorithmConfig.for_variant("grpo" if lora else "sao",
                                            **({"group_size": 2} if lora else {}))
  return C.Config(model=model, algorithm=algorithm,
                  learner=C.LearnerConfig(batch_trajectories=4, critic_warmup_steps=0),
                  lora=C.LoraConfig(enabled=lora, rank=4, alpha=8.0),
                  run=C.RunConfig(run_dir=str(run_dir), tokenizer=str(tokenizer_dir)),
                  checkpoint=C.CheckpointConfig(async_save=False)).validate().with_run_paths()


def _saved_run(tmp_path, family, *, lora=False, template=True):
  """(cfg, saved state, start-up log): a run of a tiny `family` model whose run.tokenizer
  is that family's tokenizer directory (without its template when not `template`),
  prepared as sao-train prepares it and checkpointed at step 3."""
  tokenizer_dir = build_tokenizer_dir(tmp_path / "tokenizers", family)
  if not template:
    (tokenizer_dir / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))
  cfg = run_config(tmp_path / "run", family, tokenizer_dir, lora=lora)
  lines = []
  bootstrap.prepare_chat(cfg, lines.append)
  state = state_lib.init_state(cfg, jax.random.key(0))
  if lora:
    state = state.replace(policy_adapters=jax.tree.map(lambda x: x + 0.01, state.policy_adapters))
  checkpointer = Checkpointer(cfg, writer=True)
  assert checkpointer.save(3, state_lib.checkpointed(cfg, state), {}, force=True)
  checkpointer.close()
  return cfg, state, lines


def _assert_template_round_trip(out, cfg):
  """transformers renders the conversation on the export as the run's format does, and
  its `generate` stops at the template's end token, where the run's episodes stopped."""
  chat = bootstrap.prepare_chat(cfg, lambda line: None)
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  eos = transformers.GenerationConfig.from_pretrained(out).eos_token_id
  assert (eos, tokenizer.convert_ids_to_tokens(eos)) == (chat.end_token_id, chat.end_token)
  for messages, generation_prompt in CONVERSATIONS:
    ours, _ = chat.encode(messages, generation_prompt)
    theirs = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False,
                                           add_generation_prompt=generation_prompt)
    assert list(theirs) == ours.tolist()


@pytest.mark.parametrize("family", list(ARCHITECTURE))
def test_a_full_run_exports_with_its_template_and_value_model(tmp_path, family):
  cfg, state, _ = _saved_run(tmp_path, family)
  out, critic = tmp_path / "exported", tmp_path / "critic"
  result = export.export_run(cfg, out, value_dir=critic, log=lambda line: None)
  assert (result["step"], result["policy_version"]) == (3, 0)
  _assert_template_round_trip(out, cfg)
  # The weights are the checkpoint's policy, and transformers builds the family's class.
  _, params = hf.load_hf(out)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(state.policy_params)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  model = transformers.AutoModelForCausalLM.from_pretrained(out)
  assert type(model).__name__ == ARCHITECTURE[family]
  _, head, value = params_io.load_params(critic)
  assert head == "value"
  for got, want in zip(jax.tree.leaves(value), jax.tree.leaves(state.value_params)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_tokenizer_without_template_trains_and_exports_chatml_and_says_so(tmp_path):
  cfg, _, lines = _saved_run(tmp_path, "qwen3", template=False)
  assert [line for line in lines if "ships no chat template" in line and "ChatML" in line]
  run_dir = tmp_path / "run"
  assert (run_dir / "chat_template.jinja").read_text() == CHATML_TEMPLATE  # recorded
  out = tmp_path / "exported"
  export.export_run(cfg, out, log=lambda line: None)
  assert (out / "chat_template.jinja").read_text() == CHATML_TEMPLATE
  _assert_template_round_trip(out, cfg)


def test_a_lora_run_exports_merged_and_as_peft_from_the_command_line(tmp_path, capsys):
  cfg, state, _ = _saved_run(tmp_path, "qwen3", lora=True)
  config_file = tmp_path / "run_config.py"
  # A configs/<name>.py of that run, as a user passes it to sao-train and sao-convert.
  config_file.write_text("import pathlib\nfrom test_export_run import run_config\n"
                         "def get_config():\n"
                         f"  return run_config(pathlib.Path({str(tmp_path / 'run')!r}), 'qwen3', "
                         f"{cfg.run.tokenizer!r}, lora=True)\n")
  out, adapter = tmp_path / "merged", tmp_path / "adapter"
  convert_cli.main(["run-to-hf", "--config", str(config_file), "--out", str(out),
                    "--peft-out", str(adapter)])
  assert "wrote the policy of step 3" in capsys.readouterr().out
  _assert_template_round_trip(out, cfg)
  _, params = hf.load_hf(out)
  for got, want in zip(jax.tree.leaves(params),
                       jax.tree.leaves(state_lib.policy_weights(cfg, state))):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
  assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4


def test_what_a_run_does_not_have_is_refused_by_name(tmp_path):
  cfg, _, _ = _saved_run(tmp_path, "qwen3")
  with pytest.raises(ValueError, match="--peft-out.*lora.enabled is false"):
    export.export_run(cfg, tmp_path / "out", peft_dir=tmp_path / "adapter")
  grpo = dataclasses.replace(cfg, algorithm=C.AlgorithmConfig.for_variant("grpo", group_size=2))
  with pytest.raises(ValueError, match="--value-out.*'grpo' trains no value model"):
    export.export_run(grpo, tmp_path / "out", value_dir=tmp_path / "critic")
  assert not (tmp_path / "out").exists()


def test_a_tokenizer_that_ships_chatml_itself_is_not_told_it_ships_none(tmp_path):
  """A directory whose chat_template.jinja is ChatML (what make_tokenizer writes) trains
  with its own template: no fallback notice (the notice is for a directory with none)."""
  tokenizer_dir = build_tokenizer_dir(tmp_path / "tokenizers", "qwen3")
  (tokenizer_dir / "chat_template.jinja").write_text(CHATML_TEMPLATE)
  lines = []
  chat = bootstrap.prepare_chat(run_config(tmp_path / "run", "qwen3", tokenizer_dir), lines.append)
  assert (chat.template, chat.fallback) == (CHATML_TEMPLATE, False)
  assert not [line for line in lines if "ships no chat template" in line]
