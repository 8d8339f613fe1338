"""Export a run's checkpoint as a Hugging Face model directory (`sao-convert run-to-hf`).

    export_run(cfg, "exported/")                          # newest checkpoint
    export_run(cfg, "exported/", step=40, value_dir="critic/", peft_dir="adapter/")

The policy of checkpoint `step` (default: the newest) of the run `cfg` describes
(local or gs://) is restored alone, each param onto its shards of the sampler
mesh over this host's devices (`evaluate.checkpoint_policy`, what `sao-eval`
restores; `JAX_PLATFORMS=cpu` restores it on the host's CPU instead); under
LoRA it is the base from `run.init` merged with the checkpoint's adapters. It
is written as `transformers` loads it (`hf.export_hf`), with the tokenizer the
run trained with (the run directory's copy, or `run.tokenizer` for a bucket run
directory) and the chat template it trained with, ChatML included, so
`apply_chat_template` on the export renders what the run's episodes rendered, and
the template's end token as `generate`'s `eos_token_id` (generation_config.json,
unless the tokenizer directory ships one), so a reply ends where an episode's did.

Optionally the value model, which has no Hugging Face class, goes to its own
sao_jax params directory (`params_io`: model_config.json with head "value" and
params.safetensors), and under LoRA the adapters to a PEFT directory.
"""

from __future__ import annotations

import pathlib

from sao_jax import storage
from sao_jax.config import Config
from sao_jax.jobs import evaluate
from sao_jax.models import hf, params_io, peft_io


def export_run(cfg: Config, out_dir: str | pathlib.Path, *, step: int | None = None,
               value_dir: str | pathlib.Path | None = None,
               peft_dir: str | pathlib.Path | None = None,
               tokenizer_dir: str | pathlib.Path | None = None,
               max_shard_bytes: int = 5 * 2**30, log=print) -> dict:
  """Writes checkpoint `step`'s policy to `out_dir` (module docstring); returns
  {"step", "policy_version", "out", "value", "peft"} (the last two None when not
  asked for). `tokenizer_dir` replaces the run's tokenizer files (the template the
  run trained with is written over whatever template it holds)."""
  if peft_dir is not None and not cfg.lora.enabled:
    raise ValueError(f"--peft-out {str(peft_dir)!r}: the run trains full params "
                     "(lora.enabled is false), so it has no adapters to export")
  if value_dir is not None and not cfg.algorithm.uses_critic:
    raise ValueError(f"--value-out {str(value_dir)!r}: algorithm.variant="
                     f"{cfg.algorithm.variant!r} trains no value model")
  cfg, mesh, chat, policy, meta = evaluate.checkpoint_policy(cfg, step)
  hf.export_hf(policy, cfg.model, out_dir, max_shard_bytes=max_shard_bytes,
               tokenizer_dir=tokenizer_dir or run_tokenizer_dir(cfg), chat_template=chat.template,
               eos_token_id=chat.end_token_id)
  log(f"wrote the policy of step {meta['step']} (policy version {meta['policy_version']}, "
      f"chat format {chat.name}) to {out_dir}")
  if value_dir is not None:
    value, _ = evaluate.restore_items(cfg, ("value_params",), meta["step"], mesh)
    params_io.save_params(value_dir, value["value_params"], cfg.model, head="value")
    log(f"wrote its value model to {value_dir} (a sao_jax params directory, head 'value')")
  if peft_dir is not None:
    adapters, _ = evaluate.restore_items(cfg, ("policy_adapters",), meta["step"], mesh)
    peft_io.export_peft(adapters["policy_adapters"], cfg.model, cfg.lora, peft_dir,
                        base_model=None if cfg.run.init == "random" else cfg.run.init)
    log(f"wrote its LoRA adapters to {peft_dir} (a PEFT adapter directory)")
  return {"step": meta["step"], "policy_version": meta["policy_version"],
          "out": str(out_dir), "value": value_dir and str(value_dir),
          "peft": peft_dir and str(peft_dir)}


def run_tokenizer_dir(cfg: Config) -> pathlib.Path:
  """The directory of the tokenizer the run trained with: the run directory's copy
  (`run.tokenizer_file`, written with its template at the run's start), or for a
  bucket run directory, which keeps none, `run.tokenizer`."""
  path = pathlib.Path(cfg.run.tokenizer_file)
  if storage.is_url(cfg.run.run_dir) and not path.exists():
    raise FileNotFoundError(f"run.tokenizer={cfg.run.tokenizer!r} does not exist here; pass "
                            "--tokenizer-dir with the tokenizer directory the run trained with")
  return path if path.is_dir() else path.parent
