"""The shared starting point of one seed's runs: a tokenizer and an SFT-warm-started policy.

    .venv/bin/python -m experiments.warm_start --config configs/experiments/tool_math.py \\
        --seed 0 --out DIR [--set section.field=value ...]

Writes DIR/tokenizer.json and DIR/policy/ (a sao_jax params directory), then
DIR/DONE.json (SFT steps done, final SFT loss, the validation-accuracy checks
when `run.sft_target_accuracy` is set, wall-clock). Every variant of a seed
then starts from these files (`--set run.init=DIR/policy --set
run.tokenizer=DIR/tokenizer.json --set run.sft_steps=0`), so all variants share
model, tokenizer and initial weights exactly, and the warm-start (on CPU the
slow part: each math demonstration runs the sandboxed Python tool) is paid once
per seed. It does what `sao-train` does before its first RL step
(`sao_jax.run.bootstrap.train_run_tokenizer`, then `sao_jax.jobs.warm_start.sft_warm_start` on
`sao_jax.run.bootstrap.demonstrations` from the `cfg.seed` random init, stopping at
`run.sft_target_accuracy` when set).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from typing import Sequence

from sao_jax.chat import chat_format
from sao_jax.config import Config
from sao_jax.jobs import startup
from sao_jax.jobs.warm_start import sft_warm_start
from sao_jax.models import params_io
from sao_jax.run.bootstrap import demonstrations, initial_policy, train_run_tokenizer

DONE_FILE = "DONE.json"


def warm_start(cfg: Config, out: pathlib.Path) -> dict:
  """Trains the tokenizer and the SFT policy of `cfg` into `out`; returns the DONE record."""
  start = time.monotonic()
  try:
    out.mkdir(parents=True, exist_ok=True)
  except OSError as error:  # a file there or in its parents, no permission
    raise ValueError(f"--out {str(out)!r} cannot be created as a directory "
                     f"({error.strerror or error}); pass another directory") from error
  tokenizer = train_run_tokenizer(cfg)
  tokenizer.save(str(out / "tokenizer.json"))
  chat = chat_format(None, tokenizer)
  policy, record = sft_warm_start(cfg, chat, initial_policy(cfg), demonstrations(cfg, chat))
  params_io.save_params(out / "policy", policy, cfg.model)
  record["wall_s"] = time.monotonic() - start
  (out / DONE_FILE).write_text(json.dumps(record, indent=2))
  return record


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="experiments.warm_start", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="a config file, e.g. configs/experiments/tool_math.py")
  parser.add_argument("--seed", type=int, required=True, help="model init and task stream seed")
  parser.add_argument("--out", required=True, help="output directory")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="SECTION.FIELD=VALUE", help="override a config field (repeatable)")
  args = parser.parse_args(argv)
  try:
    cfg = startup.load(args.config, [*args.overrides, f"seed={args.seed}",
                                      f"env.seed={args.seed}"])
    if cfg.run.sft_steps <= 0:
      raise ValueError(f"run.sft_steps={cfg.run.sft_steps}: a warm-start needs SFT steps > 0")
    record = warm_start(cfg, pathlib.Path(args.out))
  except (ValueError, FileNotFoundError) as error:
    parser.exit(2, f"error: {error}\n")
  print(f"warm-start done: {json.dumps(record)}")


if __name__ == "__main__":
  main()
