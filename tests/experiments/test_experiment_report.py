"""experiments.report on synthetic runs: tables, verdicts, plots, padding and resume handling."""

import json

import numpy as np
import pytest

from experiments import report, runs as runs_lib
from synthetic_runs import write_manifest, write_run

STEPS = 40


def _ordering_claim(out, levels, noise=0.01, seed_offsets=(0.0,) * 5, start=0.2):
  """claim1_ordering with final held-out accuracy `levels[variant]` per variant, one seed
  per entry of `seed_offsets` (5: the seeds the claim registered); `seed_offsets[s]`
  shifts every variant of seed s (a better or worse warm-start)."""
  rng = np.random.default_rng(0)
  runs = {}
  for variant, level in levels.items():
    for seed in range(len(seed_offsets)):
      level_s = level + seed_offsets[seed]
      rewards = np.clip(np.linspace(start, level_s, STEPS) + rng.normal(0, noise, STEPS), 0, 1)
      accuracies = [start, (start + level_s) / 2, level_s + rng.normal(0, noise)]
      rel = write_run(out, "tool_math", variant, seed, rewards.tolist(), accuracies=accuracies,
                      eval_every=STEPS // 2)
      runs.setdefault(variant, {})[str(seed)] = rel
  write_manifest(out, "claim1_ordering", "tool_math", runs, steps=STEPS)


def test_ordering_report_agrees(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "docs" / "results.md"
  _ordering_claim(out, {"sao": 0.9, "grpo_dis": 0.7, "grpo": 0.4})
  text = report.write_report(out, doc).read_text()
  section = text.split("## Claim 1")[1].split("## Claim 2")[0]
  for label in ("SAO (the paper's)", "GRPO+DIS", "GRPO"):
    assert f"| {label} | 5 |" in section
    for seed in range(5):
      assert f"| {label} | {seed} |" in section  # the per-run table
  assert "Comparison (on final held-out accuracy): **agrees**" in section
  assert "**Verdict: agrees.** Manipulation check passed" in section
  assert "Which SAO ran: SAO (the paper's)." in section
  # Final accuracies ~0.9/0.7/0.4 of 64 episodes: binomial SEs ~0.038/0.057/0.061.
  noise = section.split("Noise of one evaluation: ")[1].split(" (mean over runs)")[0]
  assert noise.startswith("a final held-out accuracy from 64 episodes has a binomial")
  assert 0.045 < float(noise.split("error of ")[1]) < 0.060, noise
  assert "40 learner steps x 16 trajectories = 640 trajectories per run" in section
  assert "same step-0 held-out accuracy" in section
  assert "| 1 | tool_math | 5 | 640 | agrees |" in text
  assert "| 2 | tool_math | - | - | not tested (no runs) |" in text
  assert "Not tested: no runs of it under `--out`" in text
  assert "- SWE-bench Verified: 23.0 (base) -> 27.0 (GRPO+DIS) -> 29.8 (SAO): **not tested**" in text
  # A registered experiment's report is linked once it exists, only named before: a
  # link to a missing page would break the docs site's strict build.
  for title, name in report.REGISTERED:
    if (report.NOTES.parent / name).is_file():
      link = text.split(f"- [{title}](")[1].split(")")[0]
      assert (doc.parent / link).resolve() == (report.NOTES.parent / name).resolve()
    else:
      assert f"- {title}: **not run yet**." in text
  link = text.split("Notes written by hand on these results: [results_notes.md](")[1].split(")")[0]
  assert (doc.parent / link).resolve() == report.NOTES.resolve()  # a link that resolves
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
          if line.startswith("| SAO (the paper's) | 5 |") or line.startswith("| GRPO | 5 |")}
  sao = rows["| SAO (the paper's)"]
  assert sao[6].startswith("0.550") and sao[7] == "20 ± 0 (5/5)"
  # 0.35: (0.2 + 0.35) / 2 = 0.275 at step 20, 0.35 at step 40: reached at 40.
  assert rows["| GRPO"][7] == "40 ± 0 (5/5)"
  assert ("Held-out accuracy AUC (mean over the run): SAO (the paper's) > GRPO+DIS: "
          "**agrees**") in section


def test_ordering_report_inconclusive_and_disagrees(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  # SAO and GRPO+DIS too close for 3 noisy seeds; GRPO clearly above GRPO+DIS.
  _ordering_claim(out, {"sao": 0.6, "grpo_dis": 0.58, "grpo": 0.9}, noise=0.05)
  section = report.write_report(out, doc).read_text().split("## Claim 1")[1]
  assert ("SAO (the paper's) > GRPO+DIS: **inconclusive** (SAO (the paper's) - GRPO+DIS on "
          "the same seed: ") in section
  assert "GRPO+DIS > GRPO: **disagrees**" in section
  assert "Comparison (on final held-out accuracy): **disagrees**" in section
  assert "**Verdict: disagrees.**" in section


def test_paired_verdict_sees_through_seed_to_seed_spread(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  # Warm-starts 0.6 apart between seeds; within each seed the paper's ordering by 0.05.
  _ordering_claim(out, {"sao": 0.4, "grpo_dis": 0.35, "grpo": 0.3}, noise=0.002,
                  seed_offsets=(0.0, 0.5, -0.1, 0.3, 0.1))
  section = report.write_report(out, doc).read_text().split("## Claim 1")[1]
  assert "SAO (the paper's) > GRPO+DIS: **agrees**" in section
  assert "whose CIs overlap" in section
  assert "Comparison (on final held-out accuracy): **agrees**" in section


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
  assert ("| SAO (the paper's) | 20 | 3 | 1.000 ± 0.000 | 6.0 ± 2.5 | 0 of 3 (counted as 20) |"
          in section)
  assert "Comparison: **agrees**" in section
  # 3 finished seeds of the 5 registered: no verdict yet, whatever the comparison says.
  assert "**Verdict: incomplete (3 of 5 seeds).** Manipulation check passed" in section
  assert (doc.parent / "results" / "claim5_realignment.png").is_file()


def _stability_claim(out, collapses, *, seeds=8, steps=100, skip=None):
  """claim6_stability, `seeds` seeds per variant; `collapses[variant]` of them (the first)
  fall to reward 0 at step 60; `skip` is the SAO gate's per-step skip flag."""
  runs = {}
  for variant in ("sao_stable", "grpo"):
    for seed in range(seeds):
      rewards = np.linspace(0.2, 0.9, steps)
      if seed < collapses[variant]:
        rewards[60:] = 0.0
      kl = np.full(steps, 0.01) if variant == "sao_stable" else np.linspace(0.01, 0.1, steps)
      extra = {"policy/kl_k3": kl, "policy/entropy": np.full(steps, 0.5)}
      if variant == "sao_stable" and skip is not None:  # as the learner logs a gated step
        extra["policy/no_contrast_skip"] = skip
        extra["policy/updated"] = 1 - np.asarray(skip, np.float64)
      rel = write_run(out, "stability", variant, seed, rewards.tolist(), extra=extra)
      runs.setdefault(variant, {})[str(seed)] = rel
  write_manifest(out, "claim6_stability", "stability", runs, steps=steps)


def test_stability_report_tests_both_halves(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  _stability_claim(out, {"sao_stable": 0, "grpo": 6}, skip=(np.arange(100) % 4 == 0))
  section = report.write_report(out, doc).read_text().split("## Claim 6")[1]
  label = "SAO centred + gated (not the paper's SAO; = sao_centered_gated)"
  # 0 of 8: Clopper-Pearson upper bound 1 - 0.025 ** (1 / 8) = 0.369.
  assert (f"{label} does not collapse: **agrees** — collapsed in 0 of 8 seeds over 100 steps, "
          "shorter than") in section
  assert "(95% Clopper-Pearson interval of its collapse rate 0.00-0.37)" in section
  # One-sided Fisher, 0 of 8 vs 6 of 8: P(X <= 0) = C(8,0) C(8,6) / C(16,6) = 28 / 8008.
  assert (f"GRPO collapses more often: **agrees** — collapsed in 6 of 8 seeds (95% "
          f"Clopper-Pearson 0.35-0.97); one-sided Fisher's exact test that {label} collapses "
          f"less: p = {28 / 8008:.3f}.") in section
  assert "**Verdict: agrees.**" in section and f"Which SAO ran: {label}." in section
  assert f"| {label} | 8 | 0 of 8 |" in section and "| GRPO | 8 | 6 of 8 |" in section
  # The gate skipped every 4th step: its share is reported.
  assert f"{label}'s contrast gate skipped the policy update on 0.250 ± 0.000 of" in section
  growth = section.split("| variant | KL growth | policy grad norm growth |")[1]
  assert f"| {label} | 1.00 ± 0.00 | n/a |" in growth
  grpo = growth.split("| GRPO | ")[1].split(" ")[0]
  assert float(grpo) == pytest.approx((0.01 + 0.09 * 87 / 99) / (0.01 + 0.09 * 12 / 99),
                                      rel=1e-3)


def test_stability_without_a_grpo_collapse_is_not_agrees(tmp_path):
  """Claim 6 has two halves: SAO stable and GRPO collapsing. 0 of 8 in both (the rerun's
  outcome) agrees on the first half only, so the verdict is inconclusive, not agrees."""
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  _stability_claim(out, {"sao_stable": 0, "grpo": 0})
  section = report.write_report(out, doc).read_text().split("## Claim 6")[1]
  assert "does not collapse: **agrees**" in section
  assert ("GRPO collapses more often: **inconclusive** — collapsed in 0 of 8 seeds (95% "
          "Clopper-Pearson 0.00-0.37)") in section
  assert "the collapse the paper reports for GRPO was not reproduced" in section
  assert "**Verdict: inconclusive.**" in section
  assert "| 6 | stability | 8 | 1600 | inconclusive |" in report.write_report(
      out, doc).read_text()


def test_stability_from_fewer_seeds_than_registered_is_incomplete(tmp_path):
  """No "agrees" from 2 seeds: claim 6 registered 8."""
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  _stability_claim(out, {"sao_stable": 0, "grpo": 2}, seeds=2)
  section = report.write_report(out, doc).read_text().split("## Claim 6")[1]
  assert "**Verdict: incomplete (2 of 8 seeds).**" in section
  assert "**agrees**" in section.split("does not collapse: ")[1][:12]  # the half, as computed


def test_a_report_that_skips_missing_claims_holds_only_the_claims_run(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "claim6.md"
  runs = {"sao_stable": {"0": write_run(out, "stability", "sao_stable", 0, [0.5] * 20)},
          "grpo": {"0": write_run(out, "stability", "grpo", 0, [0.5] * 20)}}
  write_manifest(out, "claim6_stability", "stability", runs, steps=20)
  full = report.write_report(out, tmp_path / "results.md").read_text()
  alone = report.write_report(out, doc, skip_missing=True).read_text()
  assert "## Claim 1" in full and "Not tested: no runs" in full
  assert "## Claim 1" not in alone and "Not tested: no runs" not in alone
  assert "## Claim 6" in alone
  assert f"--report {doc} --skip-missing`" in alone  # the command that regenerates it
  # Its figure carries its name: results.md's (written by the full report) is not overwritten.
  assert "![claim6_stability](results/claim6_claim6_stability.png)" in alone
  figures = tmp_path / "results"
  assert (figures / "claim6_claim6_stability.png").is_file()
  assert (figures / "claim6_stability.png").is_file()
  assert "![claim6_stability](results/claim6_stability.png)" in full


def test_stability_without_any_reward_is_a_failed_setting(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  _stability_claim(out, {"sao_stable": 0, "grpo": 0}, steps=20)
  for rel in (out / "runs" / "stability").iterdir():  # every reward 0: nothing to lose
    path = rel / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, **({"reward/mean": 0.0} if "reward/mean" in r
                                                 else {})}) + "\n" for r in rows))
  section = report.write_report(out, doc).read_text().split("## Claim 6")[1]
  assert "**Verdict: setting failed.** Manipulation check FAILED: the subject's trailing" in section
  assert "rose above 0.02 in 0 of 8 runs" in section


def test_claim5_whose_reward_stays_at_the_floor_after_the_switch_failed_its_setting(tmp_path):
  """Claim 5's runs: reward at the floor after the first switch in every run (none back at
  90% of its pre-switch level), so the steps-to-recover are all censored at the phase
  length and their tie says nothing: "setting failed", not "inconclusive"."""
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  switches, steps = (20, 40), 60
  runs = {}
  for variant in ("sao", "running_mean"):
    for seed in range(5):
      rewards = np.zeros(steps)
      rewards[:20] = np.linspace(0.1, 0.6, 20)
      runs.setdefault(variant, {})[str(seed)] = write_run(out, "style", variant, seed,
                                                          rewards.tolist())
  write_manifest(out, "claim5_realignment", "style", runs, steps=steps, switches=switches)
  text = report.write_report(out, doc).read_text()
  section = text.split("## Claim 5")[1]
  assert ("**Verdict: setting failed.** Manipulation check FAILED: after the first switch "
          "(step 20) 0 of 10 runs recovered 90% of their pre-switch reward within the phase "
          "(registered: at least one); mean training reward over the phase 0.000") in section
  assert "| 5 | style | 5 | 960 | setting failed |" in text


def test_ordering_claim_at_the_floor_failed_its_setting(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  _ordering_claim(out, {"sao": 0.0, "grpo_dis": 0.0, "grpo": 0.0}, noise=0.0, start=0.0)
  section = report.write_report(out, doc).read_text().split("## Claim 1")[1]
  assert "**Verdict: setting failed.** Manipulation check FAILED: held-out accuracy at step 0 " \
         "0.000" in section


def test_inconclusive_states_the_minimum_detectable_difference(tmp_path):
  out, doc = tmp_path / "runs", tmp_path / "results.md"
  _ordering_claim(out, {"sao": 0.6, "grpo_dis": 0.58, "grpo": 0.5}, noise=0.05)
  section = report.write_report(out, doc).read_text().split("## Claim 1")[1]
  first = section.split("SAO (the paper's) > GRPO+DIS: **inconclusive** (")[1].split("; GRPO+DIS")[0]
  sao = {s: runs_lib.load_run(out / f"runs/tool_math/sao-seed{s}").final_accuracy
         for s in range(5)}
  dis = {s: runs_lib.load_run(out / f"runs/tool_math/grpo_dis-seed{s}").final_accuracy
         for s in range(5)}
  differences = np.array([sao[s] - dis[s] for s in range(5)])
  # (t_0.975,4 + t_0.8,4) * sd / sqrt(5) = (2.776 + 0.941) * sd / sqrt(5)
  expected = (2.7764 + 0.9410) * differences.std(ddof=1) / np.sqrt(5)
  mdd = float(first.split("minimum detectable difference at 80% power ")[1].rstrip(")"))
  assert mdd == pytest.approx(expected, abs=2e-3)


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


def test_a_registered_experiment_is_listed_with_its_setting_and_critic_check(tmp_path,
                                                                             monkeypatch):
  """results.md repeats, beside each registered verdict, the setting its report says the
  result holds for and the critic check's reading, as the report words them."""
  monkeypatch.setattr(report, "NOTES", tmp_path / "results_notes.md")
  (tmp_path / "e1.md").write_text(
      "# E1\n\n**Verdict (SAO wins): not supported.** Details.\n\n"
      "The result holds for: `sao` with policy lr 1e-4; per learner step.\n\n"
      "Critic check (added after the registration): ... By this check the verdict reads: "
      "**the critic did not learn (not: SAO lost)**.\n")
  lines = report._registered(tmp_path / "results.md")
  title = report.REGISTERED[0][0]
  assert lines[2] == (f"- [{title}](e1.md): **not supported**. The result holds for: `sao` "
                      "with policy lr 1e-4; per learner step. By the critic check added after "
                      "the registration: **the critic did not learn (not: SAO lost)**.")
  assert lines[3] == f"- {report.REGISTERED[1][0]}: **not run yet**."
