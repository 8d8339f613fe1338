"""experiments.runner and claims, no training: overrides, phases, warm-start keys, resuming."""

import concurrent.futures
import dataclasses
import importlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from experiments import claims, runner, runs, warm_start
from sao_jax.config import AlgorithmConfig, apply_overrides, load_config


@pytest.mark.parametrize("name", sorted(claims.VARIANTS))
def test_variant_overrides_give_the_variant(name):
  variant = claims.VARIANTS[name]
  base = load_config(runner.setting_path("tool_math"))
  cfg = apply_overrides(base, runner.variant_overrides(base, variant)).validate()
  assert cfg.algorithm == AlgorithmConfig.for_variant(variant.preset, **dict(variant.fields))
  assert dataclasses.replace(cfg, algorithm=base.algorithm) == base  # nothing else changes


def test_every_claim_has_its_script_and_known_variants():
  for claim in claims.CLAIMS:
    assert set(claim.variants) <= set(claims.VARIANTS)
    assert {v for pair in claim.expected for v in pair} <= set(claim.variants)
    module = importlib.import_module(f"experiments.{claim.name}")
    assert f'CLAIMS_BY_NAME["{claim.name}"]' in open(module.__file__).read()
    load_config(runner.setting_path(claim.setting), runner.quick_overrides(claim.setting))


def test_style_runs_are_split_at_each_switch():
  cfg = load_config(runner.setting_path("style"))
  schedule, steps = cfg.env.style_schedule, cfg.learner.steps
  split = runner.phases(cfg, style_switches=True)
  assert [end for end, _ in split] == [schedule[1][0], schedule[2][0], steps]
  for (end, overrides), (_, name) in zip(split, schedule):
    resolved = apply_overrides(cfg, overrides).validate()
    assert resolved.env.style_schedule == ((0, name),) and resolved.learner.steps == end
  tool = load_config(runner.setting_path("tool_math"))
  assert runner.phases(tool, style_switches=False) == [(tool.learner.steps, ())]


def test_warm_starts_are_shared_only_between_equal_settings(tmp_path):
  dirs = lambda setting, *o: runner.warm_start_dir(
      tmp_path, load_config(runner.setting_path(setting), [*o, *runner.seed_overrides(1)]))
  assert dirs("tool_math") == dirs("tool_math", "learner.steps=7")  # RL fields: one warm-start
  assert dirs("tool_math") != dirs("stability")  # other tasks and SFT
  assert dirs("tool_math").name.endswith("-seed1")
  assert dirs("tool_math") != dirs("tool_math", "run.sft_steps=5")
  assert (dirs("tool_math", "run.sft_target_accuracy=0.3")
          != dirs("tool_math", "run.sft_target_accuracy=0.4"))
  assert dirs("tool_math") != dirs("style")
  # The held-out evaluation's size is an RL field; the SFT checks' size is not.
  assert dirs("tool_math") == dirs("tool_math", "run.eval_episodes=512")
  assert dirs("tool_math") != dirs("tool_math", "run.sft_check_episodes=32")


def _prepared_run(tmp_path, overrides_recorded=None, done=False):
  """A run directory (and its warm-start marker) as the runner would find them."""
  claim = claims.CLAIMS_BY_NAME["claim1_ordering"]
  shared = [*runner.quick_overrides("tool_math"), *runner.seed_overrides(0)]
  warm = runner.warm_start_dir(tmp_path, load_config(runner.setting_path("tool_math"), shared))
  warm.mkdir(parents=True)
  (warm / warm_start.DONE_FILE).write_text("{}")
  run_dir = tmp_path / "runs" / "tool_math" / "sao-seed0"
  run_dir.mkdir(parents=True)
  expected = [*shared, f"run.init={warm / 'policy'}", f"run.tokenizer={warm / 'tokenizer.json'}",
              "run.sft_steps=0", f"run.run_dir={run_dir}"]
  state = {"variant": "sao", "seed": 0, "invocations": [], "done": done,
           "overrides": expected if overrides_recorded is None else overrides_recorded}
  (run_dir / runs.STATE_FILE).write_text(json.dumps(state))
  return claim, run_dir


def test_finished_runs_are_skipped(tmp_path, capsys):
  claim, run_dir = _prepared_run(tmp_path, done=True)
  assert runner.run_one(claim, claims.VARIANTS["sao"], 0, quick=True, extra=(),
                        out=tmp_path) == run_dir
  assert "done, skipped" in capsys.readouterr().out


def test_a_run_with_other_overrides_is_refused(tmp_path):
  claim, _ = _prepared_run(tmp_path, overrides_recorded=["learner.steps=999"])
  with pytest.raises(RuntimeError, match="other overrides"):
    runner.run_one(claim, claims.VARIANTS["sao"], 0, quick=True, extra=(), out=tmp_path)


def test_parallel_runs_of_a_seed_make_its_warm_start_once(tmp_path, monkeypatch):
  calls = []

  def fake_call(command, log_path):  # a slow warm-start that writes its DONE marker
    calls.append(command)
    time.sleep(0.2)
    out = pathlib.Path(command[command.index("--out") + 1])
    (out / warm_start.DONE_FILE).write_text("{}")
    return 0, 0.2

  monkeypatch.setattr(runner, "_call", fake_call)
  path = runner.setting_path("tool_math")
  shared = [*runner.quick_overrides("tool_math"), *runner.seed_overrides(0)]
  cfg = load_config(path, shared)
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    dirs = list(pool.map(lambda _: runner.ensure_warm_start(path, shared, cfg, tmp_path),
                         range(3)))
  assert len(calls) == 1 and len(set(dirs)) == 1


@pytest.mark.parametrize("jobs, expected", [
    (1, [("sao_stable", 0), ("grpo", 0), ("sao_stable", 1), ("grpo", 1)]),
    (2, [("sao_stable", 0), ("sao_stable", 1), ("grpo", 0), ("grpo", 1)])])
def test_one_job_runs_seed_by_seed_parallel_jobs_variant_by_variant(tmp_path, monkeypatch, jobs,
                                                                    expected):
  started = []

  def fake_run_one(claim, variant, seed, **_):
    started.append((variant.name, seed))
    time.sleep(0.05)  # parallel starts follow the submission order
    return tmp_path / variant.name / str(seed)

  monkeypatch.setattr(runner, "run_one", fake_run_one)
  runner.run_claim(claims.CLAIMS_BY_NAME["claim6_stability"], seeds=2, quick=True, extra=[],
                   out=tmp_path, jobs=jobs)
  assert (started if jobs == 1 else sorted(started[:2]) + sorted(started[2:])) == expected


@pytest.mark.parametrize("claim", claims.CLAIMS, ids=lambda c: c.name)
def test_every_run_of_every_claim_has_a_valid_config(claim, tmp_path):
  path = runner.setting_path(claim.setting)
  for quick in (False, True):
    shared = [*(runner.quick_overrides(claim.setting) if quick else ()),
              *runner.seed_overrides(0)]
    cfg = load_config(path, shared)
    for name in claim.variants:
      overrides = runner.run_overrides(cfg, shared, claims.VARIANTS[name], tmp_path / "warm",
                                       tmp_path / name)
      resolved = load_config(path, overrides)  # validates
      assert resolved.run.sft_steps == 0 and resolved.run.init == str(tmp_path / "warm" / "policy")
      assert resolved.algorithm.variant == claims.VARIANTS[name].preset


# The warm-starts the runs in docs/research/results.md started from, per setting (seeds 0-4).
REPORTED_WARM_STARTS = {
    "stability": ["math_tool-6e0b8b38-seed0", "math_tool-103c6f66-seed1",
                  "math_tool-a8227efd-seed2", "math_tool-5778acfd-seed3",
                  "math_tool-f3fffb37-seed4"],
    "tool_math": ["math_tool-e49fa419-seed0", "math_tool-9be5fd69-seed1",
                  "math_tool-ea82260f-seed2", "math_tool-3c0a95b4-seed3",
                  "math_tool-2a7e1155-seed4"],
    "style": ["style-19f72793-seed0", "style-08b32db6-seed1", "style-3433c674-seed2",
              "style-e7251f0f-seed3", "style-85271228-seed4"],
}


@pytest.mark.parametrize("setting", sorted(REPORTED_WARM_STARTS))
def test_settings_keep_the_warm_starts_their_runs_started_from(setting):
  """docs/research/results.md's runs started from these warm-starts. If this fails, a config
  change moved the setting (the experiments derive from configs/experiments/base.py,
  not from the demo, for that reason): rerun its claims and update the keys, or undo
  the change."""
  keys = [runner.warm_start_dir(pathlib.Path("out"), load_config(
      runner.setting_path(setting), runner.seed_overrides(seed))).name for seed in range(5)]
  assert keys == REPORTED_WARM_STARTS[setting]


def test_a_killed_runner_stops_the_run_it_started(tmp_path):
  # Before: killing the claim script left its sao-train child training; the script
  # started again on the same --out ran a second learner beside it.
  pid_file = tmp_path / "child.pid"
  child = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
           "time.sleep(120)")
  script = ("import pathlib, sys; from experiments import runner; "
            f"runner._call([sys.executable, '-c', {child!r}], pathlib.Path({str(tmp_path)!r}) "
            "/ 'log')")
  claim_script = subprocess.Popen([sys.executable, "-c", script], cwd=runner.ROOT)
  try:
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
      time.sleep(0.1)
    child_pid = int(pid_file.read_text())
    os.kill(claim_script.pid, signal.SIGKILL)
    claim_script.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
      try:
        os.kill(child_pid, 0)
      except ProcessLookupError:
        break
      with open(f"/proc/{child_pid}/stat") as stat:  # a zombie awaiting its reaper is gone
        if stat.read().rpartition(")")[2].split()[0] == "Z":
          break
      time.sleep(0.1)
    else:
      os.kill(child_pid, signal.SIGKILL)
      pytest.fail("the run went on after its runner was killed")
  finally:
    if claim_script.poll() is None:
      claim_script.kill()


def test_warm_start_cli_names_an_out_that_is_a_file(tmp_path, capsys):
  # Before: a FileExistsError traceback from mkdir.
  (tmp_path / "taken").write_text("x")
  with pytest.raises(SystemExit) as exit_info:
    warm_start.main(["--config", str(runner.ROOT / "configs" / "demo_cpu.py"), "--seed", "0",
                     "--out", str(tmp_path / "taken")])
  assert exit_info.value.code == 2
  assert "--out '" in capsys.readouterr().err and (tmp_path / "taken").read_text() == "x"
