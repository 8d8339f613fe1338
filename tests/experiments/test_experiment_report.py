"""experiments.report on synthetic runs: tables, verdicts, plots, padding and resume handling."""

import json

import numpy as np
import pytest

from experiments import report, runs as runs_lib
from synthetic_runs import write_manifest, write_run

STEPS = 40


def _ordering_claim(out, levels, noise=0.01, seed_offsets=(0.0, 0.0, 0.0)):
  """claim1_ordering with final held-out accuracy `levels[variant]` per variant, 3 seeds;
  `seed_offsets[s]` shifts every variant of seed s (a better or worse warm-start)."""
  rng = np.random.default_rng(0)
  runs = {}
  for variant, level in levels.items():
    for seed in range(3):
      level_s = level + seed_offsets[seed]
      rewards = np.clip(np.linspace(0.2, level_s, STEPS) + rng.normal(0, noise, STEPS), 0, 1)
      accuracies = [0.2, (0.2 + level_s) / 2, level_s + rng.normal(0, noise)]
      rel = write_run(out, "tool_math", variant, seed, rewards.tolist(), accuracies=accuracies,
                      eval_every=STEPS // 2)
      runs.setdefault(variant, {})[str(seed)] = rel
  write_manifest(out, "claim1_ordering", "tool_math", runs, steps=STEPS)


def test_ordering_report_agrees(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "docs" / "results.md"
  _ordering_claim(out, {"sao": 0.9, "grpo_dis": 0.7, "grpo": 0.4})
  text = report.write_report(out, doc).read_text()
  section = text.split("## Claim 1")[1].split("## Claim 2")[0]
  for label in ("SAO", "GRPO+DIS", "GRPO"):
    assert f"| {label} | 3 |" in section
    for seed in range(3):
      assert f"| {label} | {seed} |" in section  # the per-run table
  assert "Verdict (on final held-out accuracy): **agrees**" in section
  # Final accuracies ~0.9/0.7/0.4 of 64 episodes: binomial SEs ~0.038/0.057/0.061.
  noise = section.split("Noise of one evaluation: ")[1].split(" (mean over runs)")[0]
  assert noise.startswith("a final held-out accuracy from 64 episodes has a binomial")
  assert 0.045 < float(noise.split("error of ")[1]) < 0.060, noise
  assert "40 learner steps x 16 trajectories = 640 trajectories per run" in section
  assert "same step-0 held-out accuracy" in section
  assert "| 1 | tool_math | 3 | 640 | agrees |" in text
  assert "| 2 | tool_math | - | - | not run |" in text
  assert "Not run yet: `.venv/bin/python -m experiments.claim2_critic_ablations" in text
  assert (doc.parent / "results" / "claim1_ordering.png").stat().st_size > 0
  assert "![claim1_ordering](results/claim1_ordering.png)" in section


def test_ordering_report_gives_the_learning_curves_area_and_steps_to_a_gain(tmp_path):
  """Accuracies 0.2, (0.2 + L) / 2, L at steps 0, 20, 40: trapezoid area per step
  0.1 + L / 2; +0.10 over step 0 is first reached at step 20 when L > 0.4."""
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  _ordering_claim(out, {"sao": 0.9, "grpo_dis": 0.7, "grpo": 0.35}, noise=0.0)
  run = runs_lib.load_run(out / "runs/tool_math/sao-seed0")
  assert run.accuracy_auc() == pytest.approx(0.1 + 0.9 / 2)
  assert run.steps_to_accuracy(0.3) == 20 and np.isnan(run.steps_to_accuracy(0.95))
  section = report.write_report(out, doc).read_text().split("## Claim 1")[1]
  assert "| held-out acc. AUC | steps to +0.10 (runs reaching it) |" in section
  rows = {line.split(" | ")[0]: line.split(" | ") for line in section.splitlines()
          if line.startswith("| SAO | 3 |") or line.startswith("| GRPO | 3 |")}
  assert rows["| SAO"][6].startswith("0.550") and rows["| SAO"][7] == "20 ± 0 (3/3)"
  # 0.35: (0.2 + 0.35) / 2 = 0.275 at step 20, 0.35 at step 40: reached at 40.
  assert rows["| GRPO"][7] == "40 ± 0 (3/3)"
  assert "Held-out accuracy AUC (mean over the run): SAO > GRPO+DIS: **agrees**" in section


def test_ordering_report_inconclusive_and_disagrees(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  # SAO and GRPO+DIS too close for 3 noisy seeds; GRPO clearly above GRPO+DIS.
  _ordering_claim(out, {"sao": 0.6, "grpo_dis": 0.58, "grpo": 0.9}, noise=0.05)
  section = report.write_report(out, doc).read_text().split("## Claim 1")[1]
  assert "SAO > GRPO+DIS: **inconclusive** (SAO - GRPO+DIS on the same seed: " in section
  assert "GRPO+DIS > GRPO: **disagrees**" in section
  assert "Verdict (on final held-out accuracy): **disagrees**" in section


def test_paired_verdict_sees_through_seed_to_seed_spread(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  # Warm-starts 0.6 apart between seeds; within each seed the paper's ordering by 0.05.
  _ordering_claim(out, {"sao": 0.4, "grpo_dis": 0.35, "grpo": 0.3}, noise=0.002,
                  seed_offsets=(0.0, 0.5, -0.1))
  section = report.write_report(out, doc).read_text().split("## Claim 1")[1]
  assert "SAO > GRPO+DIS: **agrees**" in section and "whose CIs overlap" in section
  assert "Verdict (on final held-out accuracy): **agrees**" in section


def test_realignment_report(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  switches, steps = (20, 40), 60
  runs = {}
  for variant, lag in (("sao", 3), ("running_mean", 12)):
    for seed in range(3):
      rewards = np.ones(steps)
      for switch in switches:  # reward 0 for `lag + seed` steps after each switch
        rewards[switch:switch + lag + seed] = 0.0
      rel = write_run(out, "style", variant, seed, rewards.tolist())
      runs.setdefault(variant, {})[str(seed)] = rel
  write_manifest(out, "claim5_realignment", "style", runs, steps=steps, switches=switches)
  section = report.write_report(out, doc).read_text().split("## Claim 5")[1]
  # Trailing window max(1, 20 // 10) = 2 needs two recovered steps: SAO takes
  # lag + seed + 2 = 5, 6, 7 post-switch steps; 6 ± 4.3027 * 1 / sqrt(3).
  assert "| SAO | 20 | 3 | 1.000 ± 0.000 | 6.0 ± 2.5 | 0 of 3 (counted as 20) |" in section
  assert "Verdict: **agrees**" in section
  assert (doc.parent / "results" / "claim5_realignment.png").is_file()


def test_stability_report(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  steps = 100
  runs = {}
  for variant in ("sao_stable", "grpo"):
    for seed in range(2):
      rewards = np.linspace(0.2, 0.9, steps)
      if variant == "grpo":
        rewards[60:] = 0.0  # collapse
      kl = np.full(steps, 0.01) if variant == "sao_stable" else np.linspace(0.01, 0.1, steps)
      extra = {"policy/kl_k3": kl, "policy/entropy": np.full(steps, 0.5)}
      rel = write_run(out, "stability", variant, seed, rewards.tolist(), extra=extra)
      runs.setdefault(variant, {})[str(seed)] = rel
  write_manifest(out, "claim6_stability", "stability", runs, steps=steps)
  section = report.write_report(out, doc).read_text().split("## Claim 6")[1]
  assert ("Verdict: **agrees** — SAO + centring + contrast gate collapsed in 0 of 2 seeds over "
          "100 steps, shorter than") in section
  # 0 of 2 vs 2 of 2: the one table as extreme, p = 2 * (1/6) (two-sided).
  assert ("GRPO collapsed in 2 of 2 seeds (Fisher's exact test of the two collapse counts, "
          "two-sided: p = 0.333).") in section
  assert "| SAO + centring + contrast gate | 2 | 0 of 2 |" in section
  assert "| GRPO | 2 | 2 of 2 |" in section
  # Growth of KL: steady for SAO; GRPO's rises 10x linearly, so its last quarter's median
  # over its first quarter's is (0.01 + 0.09 * 87/99) / (0.01 + 0.09 * 12/99) ~= 4.26.
  growth = section.split("| variant | KL growth | policy grad norm growth |")[1]
  assert "| SAO + centring + contrast gate | 1.00 ± 0.00 | n/a |" in growth
  grpo = growth.split("| GRPO | ")[1].split(" ")[0]
  assert float(grpo) == pytest.approx((0.01 + 0.09 * 87 / 99) / (0.01 + 0.09 * 12 / 99),
                                      rel=1e-3)


def test_a_report_that_skips_missing_claims_holds_only_the_claims_run(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "claim6.md"
  runs = {"sao_stable": {"0": write_run(out, "stability", "sao_stable", 0, [0.5] * 20)},
          "grpo": {"0": write_run(out, "stability", "grpo", 0, [0.5] * 20)}}
  write_manifest(out, "claim6_stability", "stability", runs, steps=20)
  full = report.write_report(out, tmp_path / "results.md").read_text()
  alone = report.write_report(out, doc, skip_missing=True).read_text()
  assert "## Claim 1" in full and "Not run yet" in full
  assert "## Claim 1" not in alone and "Not run yet" not in alone and "## Claim 6" in alone
  assert f"--report {doc} --skip-missing`" in alone  # the command that regenerates it
  # Its figure carries its name: results.md's (written by the full report) is not overwritten.
  assert "![claim6_stability](results/claim6_claim6_stability.png)" in alone
  figures = tmp_path / "results"
  assert (figures / "claim6_claim6_stability.png").is_file()
  assert (figures / "claim6_stability.png").is_file()
  assert "![claim6_stability](results/claim6_stability.png)" in full


def test_stability_without_any_reward_is_not_measurable(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  runs = {"sao_stable": {"0": write_run(out, "stability", "sao_stable", 0, [0.0] * 20)},
          "grpo": {"0": write_run(out, "stability", "grpo", 0, [0.0] * 20)}}
  write_manifest(out, "claim6_stability", "stability", runs, steps=20)
  section = report.write_report(out, doc).read_text().split("## Claim 6")[1]
  assert "Verdict: **not measurable**" in section and "in 0 of 1; fewer than 2 seeds)" in section


def test_stability_with_one_seed_is_inconclusive(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  rising = np.linspace(0.2, 0.8, 20)
  runs = {"sao_stable": {"0": write_run(out, "stability", "sao_stable", 0, rising)},
          "grpo": {"0": write_run(out, "stability", "grpo", 0, np.linspace(0.2, 0.8, 20))}}
  write_manifest(out, "claim6_stability", "stability", runs, steps=20)
  section = report.write_report(out, doc).read_text().split("## Claim 6")[1]
  assert ("Verdict: **inconclusive** — SAO + centring + contrast gate collapsed in 0 of 1 "
          "seeds") in section


def test_load_run_counts_trajectories_and_keeps_the_last_duplicate(tmp_path):
  rel = write_run(tmp_path, "tool_math", "grpo", 0, [0.5, 1.0, 0.25], padding=[8, 0, 4],
                  accuracies=[0.1, 0.3], eval_every=3, duplicate_last=True,
                  extra={"dropped/stale": [0, 1, 2]})
  run = runs_lib.load_run(tmp_path / rel)
  np.testing.assert_allclose(run.reward, [0.5, 1.0, 0.25])  # the rewritten last step wins
  assert run.steps.tolist() == [0, 1, 2]
  assert run.trained == 16 * 3 - 12 and run.dropped == 2 and run.wall_s == 60.0
  assert run.accuracy_at(0) == 0.1 and run.final_accuracy == 0.3
  assert run.final_reward(0.5) == pytest.approx(0.25)  # the last max(1, 3 // 2) = 1 step


def test_load_run_blanks_policy_metrics_of_value_only_steps(tmp_path):
  rel = write_run(tmp_path, "stability", "sao", 0, [0.1, 0.2, 0.3],
                  extra={"policy/updated": [0, 1, 1], "policy/entropy": [0.0, 0.5, 0.4],
                         "value/loss": [0.2, 0.1, 0.1]})
  run = runs_lib.load_run(tmp_path / rel)
  np.testing.assert_array_equal(run.metrics["policy/entropy"], [np.nan, 0.5, 0.4])
  np.testing.assert_array_equal(run.metrics["value/loss"], [0.2, 0.1, 0.1])
  np.testing.assert_array_equal(run.metrics["policy/updated"], [0, 1, 1])


def test_report_cli_needs_runs(tmp_path):
  with pytest.raises(SystemExit) as exit_info:
    report.main(["--out", str(tmp_path), "--report", str(tmp_path / "r.md")])
  assert exit_info.value.code == 2


def test_warm_start_table_lists_the_runs_starts_and_whether_sft_reached_its_target(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  _ordering_claim(out, {"sao": 0.9, "grpo_dis": 0.7, "grpo": 0.4})
  # The synthetic runs of seed k start from warm/seed{k}/policy.
  records = {"seed0": {"sft_steps": 300, "final_sft_loss": 0.5, "wall_s": 60.0},
             "math_tool-unused-seed0": {"sft_steps": 7, "final_sft_loss": 0.5, "wall_s": 1.0},
             "seed1": {"sft_steps": 125, "final_sft_loss": 0.25, "wall_s": 90.0,
                                      "target_accuracy": 0.5, "reached_target": True,
                                      "validation": [[100, 0.375], [125, 0.515625]]},
             "seed2": {"sft_steps": 300, "final_sft_loss": 0.125, "wall_s": 120.0,
                                      "target_accuracy": 0.5, "reached_target": False,
                                      "validation": [[300, 0.25]]}}
  # A second setting's run from seed 0's warm-start: the table names both settings.
  rel = write_run(out, "stability", "sao", 0, [0.5] * STEPS)
  write_manifest(out, "claim6_stability", "stability", {"sao": {"0": rel}}, steps=STEPS)
  for name, record in records.items():
    (out / "warm_start" / name).mkdir(parents=True)
    (out / "warm_start" / name / "DONE.json").write_text(json.dumps(record))
  text = report.write_report(out, doc).read_text()
  assert "| warm-start | setting | SFT steps |" in text
  assert "| seed0 | stability, tool_math | 300 | 0.500 | - | 1.0 min |" in text
  assert "| seed1 | tool_math | 125 | 0.250 | 0.516 (target 0.50) | 1.5 min |" in text
  assert "| seed2 | tool_math | 300 | 0.125 | 0.250 (target 0.50, not reached) |" in text
  assert "unused" not in text  # no run started from it


@pytest.mark.parametrize("where", ["dir", "under_a_file"])
def test_report_cli_names_a_report_path_it_cannot_write(tmp_path, capsys, where):
  # Before: an IsADirectoryError / NotADirectoryError traceback.
  (tmp_path / "claims").mkdir()
  (tmp_path / "taken").write_text("x")
  target = tmp_path if where == "dir" else tmp_path / "taken" / "report.md"
  with pytest.raises(SystemExit) as exit_info:
    report.main(["--out", str(tmp_path), "--report", str(target)])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2
  assert ("is a directory; pass a file path" if where == "dir" else "taken' is a file") in err


def test_claim_script_checks_its_paths_before_any_run(tmp_path, monkeypatch, capsys):
  # Before: every run trained (hours), then writing the report raised IsADirectoryError.
  from experiments import claims, runner

  started = []
  monkeypatch.setattr(runner, "run_claim", lambda *args, **kwargs: started.append(1) or [])
  (tmp_path / "taken").write_text("x")
  claim = claims.CLAIMS_BY_NAME["claim1_ordering"]
  for args, message in ((["--out", str(tmp_path / "runs"), "--report", str(tmp_path)],
                         "is a directory; pass a file path"),
                        (["--out", str(tmp_path / "taken")], "taken' is a file")):
    with pytest.raises(SystemExit) as exit_info:
      runner.main(claim, args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
  assert not started
