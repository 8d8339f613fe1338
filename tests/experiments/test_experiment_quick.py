"""A claim script end to end in --quick mode (slow: ~10 min on 2 loaded cores).

Runs claim 1 for 2 seeds, two runs at a time (`--jobs 2`), into a temporary
directory: two warm-starts, six sao-train runs, the report; then runs it
again, which must skip every run.
"""

import json
import pathlib
import subprocess
import sys

import pytest

from experiments import claims

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_claim1_quick_end_to_end(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "docs" / "results.md"
  command = [sys.executable, "-m", "experiments.claim1_ordering", "--quick", "--seeds", "2",
             "--out", str(out), "--report", str(doc)]
  first = subprocess.run([*command, "--jobs", "2"], cwd=ROOT, capture_output=True, text=True,
                         timeout=3600)
  assert first.returncode == 0, first.stdout + first.stderr
  for seed in (0, 1):  # each made once, though two runs of the seed may start together
    assert first.stdout.count(f"warm-start seed {seed} done") == 1, first.stdout
  text = doc.read_text()
  section = text.split("## Claim 1")[1].split("## Claim 2")[0]
  assert "quick mode" in section
  claim = claims.CLAIMS_BY_NAME["claim1_ordering"]
  for label in (claims.VARIANTS[name].label for name in claim.variants):
    assert f"| {label} | 2 |" in section
    for seed in (0, 1):
      assert f"| {label} | {seed} |" in section
  assert "same step-0 held-out accuracy" in section
  assert (doc.parent / "results" / "claim1_ordering.png").stat().st_size > 0
  manifest = json.loads((out / "claims" / "claim1_ordering.json").read_text())
  assert {v: sorted(s) for v, s in manifest["runs"].items()} == {
      v: ["0", "1"] for v in ("sao", "grpo_dis", "grpo")}
  second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert second.returncode == 0 and second.stdout.count("done, skipped") == 6, second.stdout
