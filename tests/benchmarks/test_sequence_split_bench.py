"""benchmarks/sequence_split.py at its own model (4 layers, full remat, blocked attention)
compiles and runs the split step, whose loss equals the unsplit one. It once failed to
compile there: `lax.axis_index` inside the sequence attention's shard_map lowered to a
PartitionId that XLA's SPMD partitioner refused, which the tests' smaller models never hit."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow  # two compiles of a 4-layer SAO step on 8 emulated devices: ~2 min
def test_the_split_step_compiles_at_the_benchmarks_model_and_equals_the_unsplit_loss():
  result = subprocess.run(
      [sys.executable, str(ROOT / "benchmarks" / "sequence_split.py"), "--lengths", "512",
       "--steps", "1"], capture_output=True, text=True, timeout=1500,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  line = next(l for l in result.stdout.splitlines() if l.startswith("RESULT "))
  found = json.loads(line[len("RESULT "):])
  assert found["lengths"] == [512]
  split, unsplit = found["peak_gib_per_device"]["split"], found["peak_gib_per_device"]["unsplit"]
  assert 0 < split[0] < unsplit[0]
  assert found["policy_loss_diff"][0] < 1e-5
