"""Where run outputs live: local directories or bucket URLs, as orbax wants them.

A URL (`gs://bucket/run`, `s3://...`) is an `epath.Path`, which reads and
writes through fsspec: the filesystem fsspec registers for the scheme (gcsfs
for gs://) must be installed, and `storage_path` says which package is missing
instead of the ImportError fsspec raises at the first file operation.

What may live in a bucket (`run.run_dir=gs://bucket/run`, or the setting named):
  - checkpoints (`checkpoint.directory`, default RUN_DIR/checkpoints: orbax) and the
    weight channel's directory (`sampler.weights_dir`);
  - the run's files, each written whole by `write_atomic` and read back through
    `as_path`: config.json, metrics.jsonl (`sao_jax.run.metrics`), summary.json,
    curves.png, the evaluation transcripts RUN_DIR/eval/episodes_step_<step>.jsonl
    and the `sao-eval` reports RUN_DIR/eval/*.json.
What must be local, and is refused for a URL (`config.run`, `config.data`) instead of
becoming a local `gs:/bucket` directory (pathlib's reading of the URL):
  - TensorBoard events (`run.loggers` with "tensorboard"): tensorboardX appends to local
    files, and a resumed run lists and deletes them (`MetricsLogger.rewind`);
  - the run's tokenizer copy: `tokenizers` and the chat template load local files, so a
    bucket run reads `run.tokenizer` (a local file or directory) and keeps no copy;
  - the directory transport (`data.transport_dir`): records are claimed by renaming
    files, which an object store cannot do atomically; use a shared filesystem (NFS);
  - the run lock (`sao_jax.run.lock`): `flock` on a local file, for a bucket run_dir one
    in this machine's temporary directory, so it refuses a second
    learner of that run on this host (learners on two hosts cannot see each other's);
  - W&B's own files (`run.loggers` with "wandb"), in wandb's default directory.
On local disk `write_atomic` writes a temporary file and renames it over the old one;
in a bucket an object upload is atomic (readers see the old object or the new one), so
the object is written in place. Objects cannot be appended to: a bucket metrics.jsonl is
rewritten whole with every row (`MetricsLogger`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import posixpath

from etils import epath

# URL scheme -> the package whose fsspec filesystem serves it, the fsspec protocol
# names epath asks for, and how to get it.
SCHEME_PACKAGES = {
    "gs": ("gcsfs", ("gcs", "gs"), "pip install 'sao-jax[gcs]' (the tpu extra has it; "
                                   "tpu_scripts/setup.sh installs it on TPU VMs)"),
    "s3": ("s3fs", ("s3",), "pip install s3fs"),
}
# Suffix of the temporary file `write_atomic` renames over its target on local disk.
PARTIAL_SUFFIX = ".partial"


def is_url(directory: str | os.PathLike) -> bool:
  """Whether `directory` names a bucket (`gs://...`) rather than a local path."""
  return "://" in str(directory)


def as_path(path: str | os.PathLike) -> pathlib.Path | epath.Path:
  """`path` to read or write a run file: a URL as an `epath.Path` (ValueError naming
  the package when its filesystem is not installed), a local path as given."""
  if is_url(path):
    check_scheme(str(path))
    return epath.Path(str(path))
  return pathlib.Path(path)


def storage_path(directory: str | os.PathLike) -> pathlib.Path | epath.Path:
  """`directory` as orbax should get it: a bucket URL (`gs://bucket/run`) as an
  `epath.Path`, which keeps the scheme (`pathlib` would make it CWD/gs:/bucket/run),
  a local path made absolute. ValueError naming the package when the scheme's
  filesystem is not installed."""
  path = as_path(directory)
  return path if is_url(directory) else path.absolute()


def join(directory: str, *names: str) -> str:
  """`directory/names...` as text: a URL keeps its `scheme://` (pathlib would fold it
  to `scheme:/`, a local directory)."""
  if is_url(directory):
    return posixpath.join(directory.rstrip("/"), *names)
  return str(pathlib.Path(directory, *names))


def write_atomic(path: pathlib.Path | epath.Path, data: bytes) -> None:
  """`data` as the whole content of `path`, which readers (and a crash) see old or new,
  never half written: on local disk a temporary file renamed over it (its directory
  made first), in a bucket one object upload. A failed local write leaves no
  temporary file behind."""
  if is_url(path):
    path.write_bytes(data)
    return
  path.parent.mkdir(parents=True, exist_ok=True)
  partial = path.with_name(path.name + PARTIAL_SUFFIX)
  try:
    partial.write_bytes(data)
    os.replace(partial, path)
  except OSError:
    with contextlib.suppress(OSError):
      partial.unlink(missing_ok=True)
    raise


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
