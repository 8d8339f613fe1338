"""`sao-eval`'s report says why episodes failed (each kind, its count and first message,
in the JSON and the printed table; before: `failures 4` and the text lost), and a second
`sao-eval` of a checkpoint keeps the first report (before: overwritten without a word)."""

import json
import pathlib

import numpy as np
import pytest

from sao_jax.cli import evaluate as evaluate_cli
from sao_jax.config import load_config
from sao_jax.jobs import eval_scores, evaluate as evaluation
from sao_jax.types import Trajectory

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo_cpu.py"
# Per task: how its episode ends (a kind the sampler names, its text), None = solved.
ENDINGS = [("ValueError", "reward function raised ValueError: no \x1b[2Kanswer"), None,
           ("reward.nan", "reward function returned nan"),
           ("ValueError", "reward function raised ValueError: a later text"),
           ("reward.str", "reward function returned 'abc'")]


class FakeEpisodes:
  """`evaluation.Episodes` without an engine: task i's episode ends as ENDINGS[i]."""

  def __init__(self, *args, **kwargs):
    pass

  def run(self, tasks, count, *, seed, desc):
    trajs = []
    for index, task in enumerate(tasks):
      ending = ENDINGS[index % len(ENDINGS)]
      info = {"task": task.id} | ({"failure_kind": ending[0]} if ending else {})
      trajs.append(Trajectory(
          tokens=np.array([1, 2], np.int32), action_mask=np.array([0, 1], np.int8),
          behavior_logp=np.array([0.0, -1.0], np.float32),
          rewards=np.array([0.0, 1.0], np.float32), prompt_id=0, policy_versions=(0, 0),
          env_failure=ending and ending[1], info=info))
    assert len(trajs) == count
    return trajs


def test_the_report_names_each_failure_kind_with_its_count_and_first_message(monkeypatch):
  monkeypatch.setattr(evaluation, "Episodes", FakeEpisodes)
  cfg = load_config(DEMO, [f"run.eval_episodes={len(ENDINGS)}", "run.eval_samples=0"])
  report = evaluation.benchmark(cfg, chat=None, params=None)
  assert report["overall"]["failures"] == 4 and report["overall"]["greedy_pass@1"] == 0.2
  assert report["failure_reasons"] == {
      "env_failure/ValueError": {"count": 2, "first_message":
                                 "reward function raised ValueError: no \\x1b[2Kanswer"},
      "env_failure/reward.nan": {"count": 1, "first_message": "reward function returned nan"},
      "env_failure/reward.str": {"count": 1, "first_message": "reward function returned 'abc'"}}
  table = eval_scores.format_table(report).splitlines()
  assert table[-4:] == [
      "failures by kind (counted as unsolved):",
      "  env_failure/ValueError 2 (first: reward function raised ValueError: no \\x1b[2Kanswer)",
      "  env_failure/reward.nan 1 (first: reward function returned nan)",
      "  env_failure/reward.str 1 (first: reward function returned 'abc')"]


REPORT = {"step": 3, "tasks": "2 tasks", "samples": 0, "temperature": None,
          **eval_scores.summarize([eval_scores.TaskScore("a", True),
                                   eval_scores.TaskScore("a", False)], ()),
          "failure_reasons": {}}


def test_a_second_sao_eval_keeps_the_first_report(tmp_path, monkeypatch, capsys):
  reports = iter([dict(REPORT, tasks="first"), dict(REPORT, tasks="second"),
                  dict(REPORT, tasks="third")])
  monkeypatch.setattr(evaluation, "evaluate_checkpoint", lambda *args, **kwargs: next(reports))
  args = ["--config", str(DEMO), "--set", f"run.run_dir={tmp_path}"]
  evaluate_cli.main(args)
  evaluate_cli.main(args)
  evaluate_cli.main(args)
  out = capsys.readouterr().out
  reports_dir = tmp_path / "eval"
  assert sorted(p.name for p in reports_dir.iterdir()) == [
      "step_3.2.json", "step_3.3.json", "step_3.json"]
  assert [json.loads((reports_dir / name).read_text())["tasks"] for name in (
      "step_3.json", "step_3.2.json", "step_3.3.json")] == ["first", "second", "third"]
  assert f"report: {reports_dir / 'step_3.json'}\n" in out
  assert (f"report: {reports_dir / 'step_3.2.json'} ({reports_dir / 'step_3.json'} holds an "
          "earlier report, kept)") in out


def test_an_existing_output_file_is_refused_before_evaluating(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(evaluation, "evaluate_checkpoint",
                      lambda *args, **kwargs: pytest.fail("evaluated before refusing"))
  (tmp_path / "report.json").write_text('{"earlier": true}')
  with pytest.raises(SystemExit) as exit_info:
    evaluate_cli.main(["--config", str(DEMO), "--output", str(tmp_path / "report.json")])
  assert exit_info.value.code == 2
  assert "already exists; remove it first to replace it, or name another file" in (
      capsys.readouterr().err)
  assert (tmp_path / "report.json").read_text() == '{"earlier": true}'
