"""Every benchmark starts the way its docstring runs it, `python benchmarks/<name>.py`
(the script's folder, not the repository, first on sys.path), and answers `--help`:
an import that works only from the repository root (`from configs...`) fails here,
as it did for env_overlap.py, before anyone spends a quiet machine on it."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))

# One interpreter for all of them (jax imports once): each script runs as __main__
# with `--help` and its own folder first on sys.path, as `python benchmarks/x.py` has.
PROBE = """
import runpy, sys
folder, failures = sys.argv[1], []
sys.path[0] = folder
for path in sys.argv[2:]:
  sys.argv = [path, "--help"]
  try:
    runpy.run_path(path, run_name="__main__")
    failures.append(f"{path}: --help did not exit")
  except SystemExit as end:
    if end.code not in (0, None):
      failures.append(f"{path}: --help exited {end.code}")
  except BaseException as error:
    failures.append(f"{path}: {type(error).__name__}: {error}")
print("\\n".join(failures))
"""


def test_every_benchmark_answers_help_when_run_as_a_script():
  assert len(SCRIPTS) >= 10
  done = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "benchmarks"),
                         *map(str, SCRIPTS)], cwd=ROOT, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  failures = [line for line in done.stdout.splitlines() if line.startswith(str(ROOT))]
  assert not failures, "\n".join(failures)
