"""Where run outputs live: local directories or bucket URLs, as orbax wants them.

A URL (`gs://bucket/run`, `s3://...`) is an `epath.Path`, which reads and
writes through fsspec: the filesystem fsspec registers for the scheme (gcsfs
for gs://) must be installed, and `storage_path` says which package is missing
instead of the ImportError fsspec raises at the first file operation.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

from etils import epath

# URL scheme -> the package whose fsspec filesystem serves it, the fsspec protocol
# names epath asks for, and how to get it.
SCHEME_PACKAGES = {
    "gs": ("gcsfs", ("gcs", "gs"), "pip install 'sao-jax[gcs]' (the tpu extra has it; "
                                   "tpu_scripts/setup.sh installs it on TPU VMs)"),
    "s3": ("s3fs", ("s3",), "pip install s3fs"),
}


def storage_path(directory: str | os.PathLike) -> pathlib.Path | epath.Path:
  """`directory` as orbax should get it: a bucket URL (`gs://bucket/run`) as an
  `epath.Path`, which keeps the scheme (`pathlib` would make it CWD/gs:/bucket/run),
  a local path made absolute. ValueError naming the package when the scheme's
  filesystem is not installed."""
  if "://" in str(directory):
    check_scheme(str(directory))
    return epath.Path(str(directory))
  return pathlib.Path(directory).absolute()


def check_scheme(url: str) -> None:
  """ValueError when no fsspec filesystem serves `url`'s scheme here: its package
  is missing (SCHEME_PACKAGES) and none was registered in its place (tests
  register an in-memory or local one with `fsspec.register_implementation`)."""
  import fsspec  # pylint: disable=import-outside-toplevel

  scheme = url.partition("://")[0]
  if scheme not in SCHEME_PACKAGES:
    return
  package, protocols, how = SCHEME_PACKAGES[scheme]
  registered = any(fsspec.registry.get(name) is not None for name in protocols)
  if not registered and importlib.util.find_spec(package) is None:
    raise ValueError(f"{url!r} is a {scheme}:// URL, which needs the {package} package (fsspec's "
                     f"{scheme}:// filesystem); it is not installed here: {how}")
