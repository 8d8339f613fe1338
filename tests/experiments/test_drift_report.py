"""experiments.drift: the pre-registered collapse / learned criteria and the report."""

import json

import pytest
from scipy import stats as scipy_stats

from experiments import drift


def write_run(directory, rewards, entropy=None, negative=None):
  """A finished run's metrics: the reward curve, and per step the policy's entropy,
  negative-advantage share and update norm (0 before the first update: step 0)."""
  entropy = entropy or [1.0] * len(rewards)
  negative = negative or [0.5] * len(rewards)
  directory.mkdir(parents=True)
  (directory / "metrics.jsonl").write_text("".join(
      json.dumps({"step": i, "reward/mean": r, "policy/entropy": e, "advantage/neg_frac": n,
                  "policy/update_norm": 0.0 if i == 0 else 0.5}) + "\n"
      for i, (r, e, n) in enumerate(zip(rewards, entropy, negative))))
  (directory / "summary.json").write_text("{}")


def test_collapse_anywhere_and_learned_at_the_end(tmp_path):
  learned = [0.25] * 10 + [1.0] * 50
  dip_then_recover = [0.25] * 10 + [1.0] * 20 + [0.0] * 10 + [1.0] * 20  # collapsed AND learned
  one_low_step = [0.25] * 30 + [0.0] + [0.25] * 29  # trailing 5-step mean stays >= 0.2
  for seed, curve in enumerate([learned, dip_then_recover, one_low_step]):
    write_run(drift.run_dir(tmp_path, "sao", seed), curve)
  result = drift.arm_result(tmp_path, "sao", range(4))  # seed 3 not run: left out
  assert result.seeds == [0, 1, 2]
  assert result.collapsed == 1 and result.learned == 2
  assert result.steps_to_learned[0] == 14  # the trailing 5-step mean first reaches 0.9
  assert result.steps_to_learned[2] == 61  # never: the budget + 1


def test_fisher_test_compares_collapse_counts(tmp_path):
  for seed in range(4):
    write_run(drift.run_dir(tmp_path, "sao", seed), [0.25] + [0.0] * 12)
    write_run(drift.run_dir(tmp_path, "sao_centred", seed), [0.25] + [1.0] * 12)
  base = drift.arm_result(tmp_path, "sao", range(4))
  centred = drift.arm_result(tmp_path, "sao_centred", range(4))
  want = scipy_stats.fisher_exact([[0, 4], [4, 0]]).pvalue
  assert drift.fisher_vs(base, centred) == pytest.approx(want)
  text = drift.report(tmp_path, range(4))
  assert f"| sao_centred | 4 | 0 | 4 | {want:.4f} |" in text
  assert "| sao | 4 | 4 | 0 | - |" in text


def test_early_diagnostics_read_only_the_first_updates(tmp_path):
  """The entropy peak and negative-advantage share come from the first
  EARLY_UPDATES steps that updated the policy: not step 0 (no update yet), not later."""
  entropy = [9.0, 1.0, 5.9, 1.2, 1.1, 7.0, 7.0]  # step 0: no update; step 5: too late
  negative = [1.0, 0.2, 0.3, 0.8, 0.1, 1.0, 1.0]
  write_run(drift.run_dir(tmp_path, "sao", 0), [0.25] * 7, entropy, negative)
  result = drift.arm_result(tmp_path, "sao", range(1))
  assert drift.EARLY_UPDATES == 4
  assert result.entropy_peak == [5.9] and result.negative_share == [0.8]
  assert "| sao | 5.900 (n=1, no CI) | 1/1 | 0.800 (n=1, no CI) |" in drift.report(tmp_path, range(1))


@pytest.mark.parametrize("args, message", [
    (["--jobs", "0"], "--jobs 0: expected at least 1"),  # before: ValueError traceback
    (["--seeds", "0"], "--seeds 0: expected at least 1"),  # before: an empty report
    (["--steps", "-3"], "--steps -3: expected at least 1"),  # before: runs of -3 steps
])
def test_drift_cli_refuses_counts_below_one(tmp_path, capsys, args, message):
  with pytest.raises(SystemExit) as exit_info:
    drift.main([*args, "--report-only", "--out", str(tmp_path / "runs"),
                "--report", str(tmp_path / "drift.md")])
  assert exit_info.value.code == 2 and message in capsys.readouterr().err
  assert not (tmp_path / "drift.md").exists()


def test_drift_cli_checks_its_paths_before_any_run(tmp_path, monkeypatch, capsys):
  # Before: every run trained (hours), then writing the report raised NotADirectoryError.
  started = []
  monkeypatch.setattr(drift, "run_one", lambda out, *job, steps: started.append(job) or out)
  (tmp_path / "taken").write_text("x")
  for args, message in ((["--out", str(tmp_path / "taken")], "taken' is a file"),
                        (["--report", str(tmp_path / "taken" / "d.md")], "taken' is a file")):
    with pytest.raises(SystemExit) as exit_info:
      drift.main(["--seeds", "1", "--arms", "sao", "--out", str(tmp_path / "runs"), *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
  assert not started
