"""benchmarks/accelerator.sh: strict and shellcheck-clean, refuses unknown flags, and its
--small run (the GPU run's pieces at tiny sizes, on CPU) prints the bf16 RESULT lines."""

import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "accelerator.sh"


def test_script_is_strict_executable_and_shellcheck_clean():
  assert os.access(SCRIPT, os.X_OK), "chmod +x benchmarks/accelerator.sh"
  assert "\nset -euo pipefail\n" in SCRIPT.read_text()
  if shutil.which("shellcheck") is None:
    pytest.skip("shellcheck not found: apt-get install shellcheck")
  result = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
  assert result.returncode == 0 and not result.stdout, result.stdout + result.stderr


def test_unknown_flag_prints_usage():
  result = subprocess.run([str(SCRIPT), "--large"], capture_output=True, text=True)
  assert result.returncode == 2 and "usage:" in result.stderr and not result.stdout


@pytest.mark.slow  # compiles the sampler's engines and a learner step: minutes on 2 cores
def test_small_run_prints_bf16_results():
  env = dict(os.environ, PYTHON=sys.executable, JAX_PLATFORMS="cpu")
  result = subprocess.run([str(SCRIPT), "--small"], capture_output=True, text=True, env=env,
                          timeout=1500)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  results = {r["name"]: r for r in (json.loads(line[len("RESULT "):])
                                    for line in result.stdout.splitlines()
                                    if line.startswith("RESULT "))}
  sampler, learner = results["sampler"], results["learner"]
  assert sampler["dtype"] == learner["dtype"] == "bfloat16"
  for value in (sampler["ours_tokens_per_s"], sampler["decode_bandwidth_fraction"],
                sampler["speedup_paged_vs_dense_longtail"], sampler["prefill_batched_speedup"],
                learner["mfu"]):
    assert math.isfinite(value) and value > 0, results
  assert math.isfinite(sampler["logp_parity_max_abs"]) and sampler["logp_parity_max_abs"] >= 0
  assert "speedup_vs_transformers" not in sampler  # --no-hf: no torch side on the GPU run
