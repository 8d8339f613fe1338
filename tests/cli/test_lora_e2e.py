"""`sao-train` with LoRA end to end on CPU: the sampler process receives only adapters
(merging them into the base it loaded once), checkpoints hold no base, `sao-eval`
and `sao-convert run-to-hf` (merged HF + PEFT directory) work from them."""

import json
import pathlib

import jax
import pytest

from sao_jax.channel import weights
from sao_jax.cli import convert as convert_cli
from sao_jax.config import load_config
from sao_jax.models import lora

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "demo_cpu.py"
TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.head_dim=8",
    "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.vocab_size=384",
    "learner.batch_trajectories=8", "learner.critic_warmup_steps=0", "run.sft_steps=0",
    "run.sft_target_accuracy=0",
    "run.eval_episodes=4", "run.eval_every=0", "sampler.slots=8", "sampler.max_new_tokens=24",
    "lora.enabled=true", "lora.rank=4", "lora.alpha=8.0", "learner.policy_lr=1e-3",
]


@pytest.mark.slow  # a whole sao-train run with a sampler process (~2-4 min on 2 cores)
def test_lora_run_syncs_adapters_only(tmp_path, monkeypatch):
  overrides = TINY + [f"run.run_dir={tmp_path / 'run'}", "learner.steps=2"]
  cfg = load_config(CONFIG, overrides)
  published, templates = [], []
  make_publisher = weights.make_publisher

  def recording_publisher(sampler_cfg, template, *rest):  # rest: the run secret
    templates.append(template)
    publisher = make_publisher(sampler_cfg, template, *rest)
    publish = publisher.publish

    def record(params, version):
      published.append((jax.tree.structure(params),
                        sum(x.nbytes for x in jax.tree.leaves(params)), version))
      publish(params, version)

    publisher.publish = record
    return publisher

  monkeypatch.setattr(weights, "make_publisher", recording_publisher)
  from sao_jax.jobs import train
  summary = train.run(cfg, log=print)
  assert summary["steps_done"] == 2 and summary["sampler_restarts"] == 0

  adapters = lora.abstract_adapters(cfg.model, cfg.lora)
  adapter_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(adapters))
  # The channel's layout (what the sampler process subscribes to) is the adapters'.
  assert jax.tree.structure(templates[0]) == jax.tree.structure(adapters)
  assert [v for _, _, v in published] == [0, 1, 2]  # first weights, then one per update
  assert all(s == jax.tree.structure(adapters) and n == adapter_bytes for s, n, _ in published)
  rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "reward/mean" in r] == [0, 1]
  # Behaviour from the merged policy at the sampler: lag-0 tokens score alike.
  lag0 = [r["mismatch/lag0_abs_logp"] for r in rows
          if r.get("mismatch/lag0_tokens", 0) > 0]
  assert all(gap < 1e-3 for gap in lag0), lag0

  from sao_jax.jobs.evaluate import evaluate_checkpoint
  assert 0.0 <= evaluate_checkpoint(cfg)["overall"]["greedy_pass@1"] <= 1.0
  sets = [arg for override in overrides for arg in ("--set", override)]
  convert_cli.main(["run-to-hf", "--config", str(CONFIG), *sets, "--out", str(tmp_path / "merged"),
                    "--peft_out", str(tmp_path / "adapter")])
  assert (tmp_path / "merged" / "model.safetensors").is_file()
  config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
  assert config["r"] == 4 and config["lora_alpha"] == 8.0
