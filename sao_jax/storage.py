"""Where run outputs live: local directories or bucket URLs, as orbax wants them."""

from __future__ import annotations

import os
import pathlib

from etils import epath


def storage_path(directory: str | os.PathLike) -> pathlib.Path | epath.Path:
  """`directory` as orbax should get it: a bucket URL (`gs://bucket/run`) as an
  `epath.Path`, which keeps the scheme (`pathlib` would make it CWD/gs:/bucket/run),
  a local path made absolute."""
  if "://" in str(directory):
    return epath.Path(str(directory))
  return pathlib.Path(directory).absolute()
