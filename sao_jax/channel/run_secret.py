"""The run's shared secret: what learner and sampler hosts prove to each other.

One secret authenticates both channels that cross hosts: the network weight
channel (`sampler.weights_wire`: handshake and signed headers) and the
directory transport (`data.sealed`: signed trajectory records and run markers).
The directory weight channel (`sampler.weights_digest`: signed versions) uses it
too. It is the bytes of `sampler.weights_secret_file`, or of the environment variable
`sampler.weights_secret_env`; a run whose peers all live in one process tree
(same-host samplers) uses a fresh random one that its children inherit, the
first learner host's on every host (`for_run`).
"""

from __future__ import annotations

import os
import pathlib
import secrets
from typing import Any

import jax

from sao_jax.config.sampler import SECRET_CREATE_HINT as CREATE_HINT

MIN_SECRET_BYTES = 16


def load_secret(cfg: Any) -> bytes | None:
  """The secret `cfg` (a SamplerConfig) names in weights_secret_file or weights_secret_env;
  None when it names none. Errors name the field and how to create a secret."""
  if cfg.weights_secret_file:
    path = pathlib.Path(cfg.weights_secret_file).expanduser()
    try:
      secret = path.read_bytes()
    except OSError as error:
      raise ValueError(f"sampler.weights_secret_file={str(path)!r} cannot be read ({error}); "
                       f"create one with `{CREATE_HINT}` and copy it to every host") from None
    field = f"sampler.weights_secret_file={str(path)!r}"
  elif cfg.weights_secret_env:
    secret = os.environ.get(cfg.weights_secret_env, "").encode()
    field = f"sampler.weights_secret_env={cfg.weights_secret_env!r}"
    if not secret:
      raise ValueError(f"{field}: the environment variable is unset or empty; export it on "
                       "every host, e.g. `export VAR=$(openssl rand -hex 32)`")
  else:
    return None
  check_secret(secret, field)
  return secret


def check_secret(secret: bytes, what: str) -> None:
  """ValueError unless `secret` is long enough to prove anything."""
  if len(secret) < MIN_SECRET_BYTES:
    raise ValueError(f"{what} holds {len(secret)} bytes; a secret needs at least "
                     f"{MIN_SECRET_BYTES} (e.g. `{CREATE_HINT}`)")


def secret_or_fresh(cfg: Any) -> bytes:
  """The configured secret (`load_secret`), else 32 fresh random bytes for peers that
  inherit it (same-host samplers)."""
  return load_secret(cfg) or secrets.token_bytes(32)


def for_run(cfg: Any) -> bytes:
  """The learner's secret for this run (`secret_or_fresh`), the first host's on every
  host, so that all of them seal and sign alike. All learner hosts call it."""
  secret = secret_or_fresh(cfg)
  if jax.process_count() > 1:
    from sao_jax.sharding import distributed  # imports JAX's multihost utilities: only when needed
    secret = distributed.from_first_host(secret)
  return secret
