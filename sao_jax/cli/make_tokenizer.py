"""Builds a tokenizer for a run whose tasks are dataset rows, offline.

  python -m sao_jax.cli.make_tokenizer --config CONFIG [--set ...] --out DIR [--rows N]
  sao-train --config CONFIG --set run.tokenizer=DIR ...

A run from scratch (`run.init="random"`) trains its own tokenizer on its
environment's demonstrations, which dataset rows do not have: this trains one
on the texts of the config's first N tasks instead (their prompt messages and
answers, read through `env.dataset`'s column mapping), `model.vocab_size`
tokens, byte-level BPE with the ChatML tokens (`tokenizer.train_tokenizer`), and
writes DIR/tokenizer.json with the ChatML template and its special tokens beside
it (`chat_template.jinja`, `tokenizer_config.json`). A run that starts from a
checkpoint uses the checkpoint's tokenizer instead (`run.init=DIR` sets it).
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import sys
from typing import Sequence

from sao_jax.chat import chat_format
from sao_jax.cli import flags
from sao_jax.envs import registry
from sao_jax.jobs import startup
from sao_jax.models.tokenizer import train_tokenizer

DEFAULT_ROWS = 10_000  # tasks whose texts the tokenizer is trained on


def texts(cfg, rows: int) -> list[str]:
  """The prompt messages' and answers' texts of `cfg`'s first `rows` tasks."""
  out = []
  for task in itertools.islice(registry.make_tasks(cfg.env), rows):
    out += [message["content"] for message in task.messages] or [task.prompt]
    out.append(task.answer)
  return out


def write(cfg, out: str | pathlib.Path, rows: int = DEFAULT_ROWS) -> pathlib.Path:
  """DIR/tokenizer.json trained on `cfg`'s tasks (module docstring), with ChatML beside it."""
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  tokenizer = train_tokenizer(texts(cfg, rows), cfg.model.vocab_size)
  tokenizer.save(str(out / "tokenizer.json"))
  chat_format(None, tokenizer).save(out)
  return out / "tokenizer.json"


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m sao_jax.cli.make_tokenizer",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="the run's configs/<name>.py file")
  flags.add_set(parser)
  parser.add_argument("--out", required=True, help="the directory to write tokenizer.json to")
  parser.add_argument("--rows", type=int, default=DEFAULT_ROWS,
                      help=f"how many tasks' texts to train on (default {DEFAULT_ROWS})")
  args = parser.parse_args(argv)
  if args.rows < 1:
    parser.error(f"--rows={args.rows} is invalid: expected a positive number of tasks")
  try:
    cfg = startup.load(args.config, list(args.overrides))
    path = write(cfg, args.out, args.rows)
  except (ValueError, FileNotFoundError) as error:
    parser.exit(2, f"error: {error}\n")
  print(f"wrote {path} ({cfg.model.vocab_size} tokens at most); train with "
        f"--set run.tokenizer={path.parent}")


if __name__ == "__main__":
  main(sys.argv[1:])
