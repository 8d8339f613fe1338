"""Flag spellings shared by the CLIs: hyphenated flags, old underscore spellings kept
as hidden aliases for one release.

    args = flags.parse(parser, argv, {"--hf_dir": "--hf-dir"})

`parse` rewrites each old spelling in `argv` (`--hf_dir X` and `--hf_dir=X`) to its
new one before argparse sees it, so the alias works everywhere the flag does
(required flags, every subcommand) and appears in no help text.
"""

from __future__ import annotations

import argparse
import sys
from typing import Mapping, Sequence

SET_HELP = ("override a config field, parsed by the field's type (repeatable): "
            "--set learner.steps=100, --set run.loggers=tensorboard,wandb")
SET_METAVAR = "SECTION.FIELD=VALUE"


def add_set(parser: argparse.ArgumentParser, help: str = SET_HELP) -> None:  # pylint: disable=redefined-builtin
  """`--set SECTION.FIELD=VALUE` (repeatable), collected into `args.overrides`."""
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar=SET_METAVAR, help=help)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
          aliases: Mapping[str, str] | None = None) -> argparse.Namespace:
  """`parser.parse_args(argv)` with each old spelling in `aliases` (old -> new)
  rewritten to the new one first."""
  argv = list(sys.argv[1:] if argv is None else argv)
  aliases = aliases or {}
  rewritten = []
  for arg in argv:
    name, eq, value = arg.partition("=")
    if name in aliases:
      arg = aliases[name] + eq + value
    rewritten.append(arg)
  return parser.parse_args(rewritten)
