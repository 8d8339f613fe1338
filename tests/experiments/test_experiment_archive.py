"""experiments.archive: runs survive the machine, and the claim resumes from them."""

import dataclasses
import json
import shutil
import subprocess

import numpy as np
import pytest

from sao_jax.config import load_config, params_json

from experiments import archive, claims, report, runner, runs as runs_lib, warm_start
from synthetic_runs import write_manifest, write_run

STEPS = 30


def _claim6(out, seeds=2):
  """claim6_stability's runs under `out`: every run finished but GRPO's last seed, whose
  experiment.json says not done and which holds a checkpoint. The recorded overrides
  name `out`, as the runner's do."""
  rng = np.random.default_rng(0)
  runs = {}
  for variant in ("sao_stable", "grpo"):
    for seed in range(seeds):
      rewards = np.clip(0.5 + rng.normal(0, 0.05, STEPS), 0, 1).tolist()
      rel = write_run(out, "stability", variant, seed, rewards)
      state_path = out / rel / runs_lib.STATE_FILE
      state = json.loads(state_path.read_text())
      state["overrides"] = [f"run.run_dir={out / rel}", f"run.init={out}/warm_start/w{seed}"]
      state["done"] = not (variant == "grpo" and seed == seeds - 1)
      state_path.write_text(json.dumps(state))
      config_path = out / rel / "config.json"
      config = json.loads(config_path.read_text())
      config["run"]["init"] = f"{out}/warm_start/w{seed}/policy"
      config_path.write_text(json.dumps(config))
      for step in (20, 25):
        (out / rel / "checkpoints" / str(step)).mkdir(parents=True)
        (out / rel / "checkpoints" / str(step) / "state").write_bytes(bytes([step]) * 10)
      runs.setdefault(variant, {})[str(seed)] = rel
  for seed in range(seeds):
    (out / "warm_start" / f"w{seed}").mkdir(parents=True)
    (out / "warm_start" / f"w{seed}" / warm_start.DONE_FILE).write_text(json.dumps(
        {"sft_steps": 300, "final_sft_loss": 0.5, "wall_s": 60.0}))
    (out / "warm_start" / f"w{seed}" / "policy").mkdir()
    (out / "warm_start" / f"w{seed}" / "policy" / "params.safetensors").write_bytes(
        bytes([seed]) * 100)
    (out / "warm_start" / f"w{seed}" / "tokenizer.json").write_text("{}")
  write_manifest(out, "claim6_stability", "stability", runs, steps=STEPS)


def test_runs_are_archived_the_part_done_with_their_newest_checkpoint_and_restored(tmp_path):
  made, box, fresh = tmp_path / "made", tmp_path / "box", tmp_path / "fresh"
  _claim6(made)
  saved = archive.save(made, box)
  assert saved == ["runs/stability/grpo-seed0", "runs/stability/grpo-seed1 (at step 25)",
                   "runs/stability/sao_stable-seed0", "runs/stability/sao_stable-seed1"]
  # Before: the unfinished run was left out, and a session that ended mid-run lost it.
  assert [str(p.relative_to(box)) for p in box.rglob("checkpoints/*")] == [
      "runs/stability/grpo-seed1/checkpoints/25"]  # the newest only, none of a done run
  assert not list(box.rglob("metrics.jsonl"))
  # Seed 0 is finished: its warm-start's record alone (restored as DONE.json it would
  # claim a policy that is not there). Seed 1's GRPO run still needs the very warm-start
  # its SAO run started from: archived whole.
  assert sorted(p.name for p in (box / "warm_start" / "w0").iterdir()) == [archive.WARM_RECORD]
  assert (box / "warm_start" / "w1" / "policy" / "params.safetensors").read_bytes() == b"\1" * 100
  assert (box / "warm_start" / "w1" / warm_start.DONE_FILE).is_file()
  assert archive.restore(box, fresh) == [rel.split(" ")[0] for rel in saved]
  assert runs_lib.latest_checkpoint(fresh / "runs/stability/grpo-seed1") == 25
  assert (fresh / "runs/stability/grpo-seed1/checkpoints/25/state").read_bytes() == b"\x19" * 10
  for rel in (r for r in saved if "at step" not in r):
    assert ((fresh / rel / "metrics.jsonl").read_bytes()
            == (made / rel / "metrics.jsonl").read_bytes())
    state = json.loads((fresh / rel / runs_lib.STATE_FILE).read_text())
    assert state["overrides"][0] == f"run.run_dir={fresh / rel}"
    assert str(made) not in json.dumps(state)
  assert not (fresh / "warm_start" / "w0" / warm_start.DONE_FILE).exists()
  assert (fresh / "warm_start" / "w0" / archive.WARM_RECORD).is_file()
  assert (fresh / "warm_start" / "w1" / warm_start.DONE_FILE).is_file()  # the runner uses it
  assert (fresh / "warm_start" / "w1" / "policy" / "params.safetensors").is_file()
  # The report reads the restored runs, and the archived warm-start records.
  text = report.write_report(fresh, tmp_path / "claim6.md", skip_missing=True).read_text()
  label = claims.VARIANTS["sao_stable"].label
  assert f"| {label} | 0 |" in text and f"| {label} | 1 |" in text and "| GRPO | 0 |" in text
  manifest = json.loads((fresh / "claims" / "claim6_stability.json").read_text())
  assert list(manifest["runs"]["grpo"]) == ["0"]  # seed 1 unfinished: neither archived nor listed
  assert "| w0 | stability | 300 |" in text and "| w1 | stability | 300 |" in text


def test_restore_never_overwrites_a_run_and_save_refuses_another_out(tmp_path):
  made, box = tmp_path / "made", tmp_path / "box"
  _claim6(made, seeds=1)
  archive.save(made, box)
  assert archive.restore(box, made) == []  # every run is already there
  with pytest.raises(ValueError, match="archives runs made under"):
    archive.save(tmp_path / "elsewhere", box)
  with pytest.raises(FileNotFoundError, match="not an experiment archive"):
    archive.restore(tmp_path / "made", tmp_path / "x")


def test_a_restored_finished_run_is_skipped_without_making_its_warm_start(tmp_path, monkeypatch):
  # Before: the runner made each seed's warm-start (300 SFT steps) before it looked at
  # whether the seed's runs were already done.
  monkeypatch.setattr(runner, "_call", lambda *a: pytest.fail(f"started {a[0][:4]}"))
  claim = claims.CLAIMS_BY_NAME["claim6_stability"]
  shared = [*runner.quick_overrides("stability"), *runner.seed_overrides(0)]
  cfg = load_config(runner.setting_path("stability"), shared)
  run_dir = tmp_path / "runs" / "stability" / "grpo-seed0"
  run_dir.mkdir(parents=True)
  overrides = runner.run_overrides(cfg, shared, claims.VARIANTS["grpo"],
                                   runner.warm_start_dir(tmp_path, cfg), run_dir)
  (run_dir / runs_lib.STATE_FILE).write_text(json.dumps(
      {"variant": "grpo", "seed": 0, "overrides": overrides, "invocations": [], "done": True}))
  assert runner.run_one(claim, claims.VARIANTS["grpo"], 0, quick=True, extra=(),
                        out=tmp_path) == run_dir


def test_a_warm_start_is_archived_whole_only_while_its_seed_is_part_done(tmp_path):
  made, box = tmp_path / "made", tmp_path / "box"
  _claim6(made)
  archive.save(made, box)
  assert (box / "warm_start" / "w1" / "policy").is_dir()
  state_path = made / "runs" / "stability" / "grpo-seed1" / runs_lib.STATE_FILE
  state_path.write_text(json.dumps({**json.loads(state_path.read_text()), "done": True}))
  assert "runs/stability/grpo-seed1" in archive.save(made, box)
  assert sorted(p.name for p in (box / "warm_start" / "w1").iterdir()) == [archive.WARM_RECORD]
  assert not list(box.rglob("checkpoints"))  # done: its checkpoint leaves the archive


def test_a_restored_part_done_run_resumes_from_its_checkpoint(tmp_path, monkeypatch):
  claim = claims.CLAIMS_BY_NAME["claim6_stability"]
  shared = [*runner.quick_overrides("stability"), *runner.seed_overrides(0)]
  cfg = load_config(runner.setting_path("stability"), shared)
  made, box, fresh = tmp_path / "made", tmp_path / "box", tmp_path / "fresh"
  warm = runner.warm_start_dir(made, cfg)
  warm.mkdir(parents=True)
  (warm / warm_start.DONE_FILE).write_text("{}")
  (warm / "policy").mkdir()
  (warm / "policy" / "params.safetensors").write_bytes(b"w" * 10)
  # The params directory's model config, as sao-convert writes it: run.init must name a
  # loadable checkpoint of the setting's architecture (config.init_model).
  (warm / "policy" / params_json.CONFIG_FILE).write_text(
      json.dumps({**dataclasses.asdict(cfg.model), "head": "lm"}))
  (warm / "tokenizer.json").write_text("{}")
  run_dir = made / "runs" / "stability" / "grpo-seed0"
  (run_dir / "checkpoints" / "3").mkdir(parents=True)  # killed mid-invocation: no state yet
  (run_dir / "config.json").write_text(json.dumps({"run": {"init": str(warm / "policy")}}))
  (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
  write_manifest(made, "claim6_stability", "stability",
                 {"sao_stable": {}, "grpo": {"0": "runs/stability/grpo-seed0"}}, steps=6)
  assert archive.save(made, box) == ["runs/stability/grpo-seed0 (at step 3)"]
  # No variant of seed 0 is done: its warm-start travels whole.
  assert (box / warm.relative_to(made) / "policy" / "params.safetensors").is_file()
  archive.restore(box, fresh)
  calls = []
  monkeypatch.setattr(runner, "_call", lambda command, log: calls.append(command) or (0, 1.0))
  monkeypatch.setattr(runs_lib, "latest_checkpoint", lambda d: 6 if calls else 3)
  runner.run_one(claim, claims.VARIANTS["grpo"], 0, quick=True, extra=(), out=fresh)
  assert len(calls) == 1 and calls[0][-1] == "--resume"
  assert f"run.run_dir={fresh / 'runs/stability/grpo-seed0'}" in calls[0]


def test_save_refuses_an_archive_git_would_leave_out(tmp_path):
  # Before: `.gitignore` had `runs/`, which also matched the archive's runs/ folder;
  # the archive was committed without its runs, and they were lost with the machine.
  repo = tmp_path / "repo"
  subprocess.run(["git", "init", "-q", str(repo)], check=True)
  (repo / ".gitignore").write_text("runs/\n")
  _claim6(tmp_path / "made", seeds=1)
  with pytest.raises(RuntimeError, match="git ignores .* archived file"):
    archive.save(tmp_path / "made", repo / "box")
  ours = runner.ROOT / "docs/research/results/claim6_runs/runs/stability/grpo-seed0/config.json"
  assert archive._git_ignored([ours]) == []  # this repository's .gitignore keeps them


def test_save_of_a_directory_without_runs_is_refused(tmp_path, capsys):
  # Before: a typo'd --out "archived 0 run(s)" and wrote an ARCHIVE.json naming the
  # typo, after which saving the real runs directory there was refused.
  with pytest.raises(SystemExit) as exit_info:
    archive.main(["save", "--out", str(tmp_path / "typo"), "--to", str(tmp_path / "box")])
  assert exit_info.value.code == 2
  assert "typo' holds no experiment runs (no claims/ directory)" in capsys.readouterr().err
  assert not (tmp_path / "box").exists()


def test_archive_paths_that_are_files_are_named(tmp_path, capsys):
  # Before: FileExistsError tracebacks from mkdir.
  made = tmp_path / "made"
  _claim6(made, seeds=1)
  (tmp_path / "taken").write_text("x")
  with pytest.raises(SystemExit):
    archive.main(["save", "--out", str(made), "--to", str(tmp_path / "taken")])
  assert "taken' is a file; pass an archive directory" in capsys.readouterr().err
  archive.save(made, tmp_path / "box")
  with pytest.raises(SystemExit):
    archive.main(["restore", "--from", str(tmp_path / "box"), "--out", str(tmp_path / "taken")])
  assert "--out '" in capsys.readouterr().err


def test_a_part_done_run_keeps_its_warm_start_whole_before_any_manifest(tmp_path):
  """The runner writes claims/<claim>.json only once a run has finished; a session that
  ends during the first run left a manifest-less --out whose warm-start was archived as
  its record alone, and the run could not resume on another machine."""
  made, box = tmp_path / "made", tmp_path / "box"
  _claim6(made)
  for path in (made / "claims").iterdir():
    path.unlink()
  for rel in ("runs/stability/grpo-seed0", "runs/stability/sao_stable-seed0",
              "runs/stability/sao_stable-seed1"):
    shutil.rmtree(made / rel)
  archive.save(made, box)
  assert (box / "warm_start" / "w1" / "policy" / "params.safetensors").is_file()
  assert not (box / "warm_start" / "w0" / "policy").exists()  # no run of seed 0 started
