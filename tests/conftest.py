"""Test-wide JAX setup: 8 emulated CPU devices, strict numerics, cheap compiles, one
compilation cache.

This must run before any JAX computation, which is why it lives here and not in
per-module XLA_FLAGS (those are order-dependent and break).

Many tests build the same program as an earlier one through a fresh `jax.jit`
(every `run_learner` call compiles its train step; a resumed run, a restarted
sampler and a subprocess compile what their predecessor compiled), and jit
objects do not share executables. JAX's persistent compilation cache, keyed by
the lowered program, the devices and the compile options, lets the later one
load the executable the first compiled: the same program runs, only XLA's
compile is skipped. The cache is a fresh directory per test session, removed at
exit, so no executable outlives the code that produced it; the environment
variables hand it to the processes tests start (samplers, CLIs). A damaged entry
(a process killed while writing it) is not fatal: JAX warns and compiles.

Under pytest-xdist (`-n 2` in `make test`) the controller process loads this
file before it starts the workers, which inherit its environment: every worker
uses the controller's directory (`_SESSION_CACHE`), so a program one worker
compiled is loaded by the other, and only the controller removes the directory,
after the workers are gone. A reader that meets an entry another process is
still writing takes it for a damaged one: it warns and compiles, as above.

The tests' programs are tiny models run for a step or two, so XLA's compile,
not the run, is most of the suite's CPU time. `JAX_DISABLE_MOST_OPTIMIZATIONS`
(jax's `jax_disable_most_optimizations`: backend optimisation level 0, LLVM's
expensive passes off) takes about 40% off the CPU time of the slowest tests
(17 of them, one process: 366 s user time before, 213 s with it).
It changes how a program is lowered to machine code, not what it computes: the
numerical tests keep their tolerances and pass with it. As an environment
variable it reaches the processes tests start, so they compile what the test
process compiled and share its cache entries. `JAX_DISABLE_MOST_OPTIMIZATIONS=0`
in the environment runs the tests with XLA's full optimisation, which benchmarks
and real runs (they never load this file) always have.
"""

import atexit
import os
import shutil
import tempfile

_SESSION_CACHE = "SAO_JAX_TESTS_XLA_CACHE"  # set by the session's first process

if _SESSION_CACHE in os.environ and "PYTEST_XDIST_WORKER" in os.environ:
  _COMPILATION_CACHE = os.environ[_SESSION_CACHE]
else:
  _COMPILATION_CACHE = tempfile.mkdtemp(prefix="sao-jax-tests-xla-cache-")
  atexit.register(shutil.rmtree, _COMPILATION_CACHE, ignore_errors=True)
  os.environ[_SESSION_CACHE] = _COMPILATION_CACHE
os.environ["JAX_COMPILATION_CACHE_DIR"] = _COMPILATION_CACHE
# Cache every program that takes XLA a noticeable time (the default 1 s leaves out
# most tiny-model steps on a quiet machine); eager op-by-op programs stay out.
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")  # "0": full optimisation

import jax  # noqa: E402  (reads the variables above)

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_compilation_cache_dir", _COMPILATION_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)

import fcntl  # noqa: E402
import pathlib  # noqa: E402

import pytest  # noqa: E402

# Test tiers: every test is exactly one of `unit` (one process, in memory),
# `integration` (real processes, sandboxes, sockets or files between processes) and
# `e2e` (a whole CLI run, several hosts or a kill-and-resume), decided here by path
# and nowhere else. `make test-unit` runs the unit tier alone for a fast inner loop;
# `make test` runs all three (slow-marked tests excluded), `make test-all` those too.
_TIERS = {
    "e2e": ("cli/", "distributed/", "tpu_scripts/", "experiments/test_experiment_runner",
            "experiments/test_experiment_quick"),
    "integration": ("envs/sandbox/", "envs/coding/", "envs/style/", "sampler/test_sampler_",
                    "sampler/test_samplers_", "sampler/test_killed_writers",
                    "sampler/test_weights_net", "sampler/test_weights_wire",
                    "learner/test_checkpoint_resume", "data/test_transport",
                    "test_checkpoint_bucket"),
}
_TESTS = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(config, items):
  for item in items:
    where = pathlib.Path(item.fspath).relative_to(_TESTS).as_posix()
    tier = next((name for name, prefixes in _TIERS.items()
                 if where.startswith(prefixes)), "unit")
    item.add_marker(getattr(pytest.mark, tier))


# Compiling a full-size program for a TPU topology takes up to ~16 GB of host RAM;
# two at once (one per xdist worker) overflow a 24 GB machine. Tests marked
# `tpu_compile` take this machine-wide lock, so they compile one at a time whatever
# the number of workers.
_COMPILE_LOCK = pathlib.Path(tempfile.gettempdir()) / f"sao-jax-tests-tpu-compile-{os.getuid()}.lock"


@pytest.fixture(autouse=True)
def _one_tpu_compile_at_a_time(request):
  if request.node.get_closest_marker("tpu_compile") is None:
    yield
    return
  with open(_COMPILE_LOCK, "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def emulated_gcs():
  """gs:// served by an in-memory fsspec filesystem standing in for gcsfs, for epath
  (which asks fsspec for "gcs") and fsspec; yields that filesystem. It reaches the
  files `sao_jax.storage` writes, not TensorStore's own gcs driver, so orbax's arrays
  in a bucket are tested against a GCS server instead (tests/test_checkpoint_bucket.py)."""
  import fsspec
  from etils.epath import backend
  from fsspec.implementations.memory import MemoryFileSystem
  from fsspec.registry import _registry

  class Bucket(MemoryFileSystem):
    protocol = ("gcs", "gs")
    root_marker = ""

    def __init__(self, *args, finalize_on_close=False, **kwargs):  # gcsfs' option, epath passes it
      del finalize_on_close
      super().__init__(*args, **kwargs)

  for name in Bucket.protocol:
    fsspec.register_implementation(name, Bucket, clobber=True)
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  Bucket.store.clear()
  yield Bucket()
  for name in Bucket.protocol:
    _registry.pop(name, None)
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  Bucket.store.clear()
