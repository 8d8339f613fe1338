"""A run that cannot change the weights, or evaluates nothing, says so (#49 item 8):
at start-up when its steps end inside the critic's warm-up, and at its end when no
evaluation ran (it printed "held-out accuracy nan")."""

import pathlib

import pytest

from sao_jax.cli import train as train_cli
from sao_jax.jobs import startup

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "configs" / "demo_cpu.py")  # sao, critic_warmup_steps=3


def test_steps_inside_the_critic_warm_up_are_named_with_the_fix():
  cfg = startup.load(DEMO, ["learner.steps=3", "learner.value_pretrain_steps=2",
                            "learner.critic_warmup_steps=1"])
  assert startup.no_policy_update(cfg) == (
      "warning: learner.steps=3 does not exceed learner.value_pretrain_steps=2 + "
      "learner.critic_warmup_steps=1 (algorithm.variant='sao' trains its critic alone first): "
      "every step of this run is value-only and no policy update would happen; set "
      "learner.steps above 3 or lower learner.critic_warmup_steps")


@pytest.mark.parametrize("overrides", [
    ["learner.steps=4"],  # one policy update after the 3 warm-up steps
    ["learner.steps=2", "algorithm.variant=grpo", "algorithm.group_size=2",
     "algorithm.value_updates_per_step=0"],  # no critic
])
def test_a_run_that_updates_the_policy_or_has_no_critic_is_not_warned(overrides):
  assert startup.no_policy_update(startup.load(DEMO, overrides)) is None


def test_check_prints_the_warning_and_still_says_valid(capsys):
  # Before: "is valid" alone, for a run that would never update its policy.
  train_cli.main(["--config", DEMO, "--check", "--set", "learner.steps=3"])
  err = capsys.readouterr().err
  assert ("sao-train: warning: learner.steps=3 does not exceed learner.value_pretrain_steps=0 "
          "+ learner.critic_warmup_steps=3") in err
  assert err.rstrip().endswith("demo_cpu.py is valid")


@pytest.mark.parametrize("eval_every, summary, last_words", [
    (0, {}, "no evaluation ran (run.eval_every=0); evaluate a checkpoint with sao-eval "
            "--config CONFIG [--step N]"),
    (50, {}, "no evaluation ran (run.eval_every=50 and no evaluation fell in this launch's "
             "steps); evaluate a checkpoint with sao-eval --config CONFIG [--step N]"),
    (20, {"eval/accuracy": 0.25}, "held-out accuracy 0.250"),
])
def test_the_last_line_says_whether_an_evaluation_ran(eval_every, summary, last_words,
                                                      tmp_path, monkeypatch, capsys):
  from sao_jax.jobs import train

  monkeypatch.setattr(train, "run", lambda cfg, resume, log, profile=None: {
      "steps_done": 8, "stopped_by": "steps", "plot": "curves.png", **summary})
  train_cli.main(["--config", DEMO, "--set", f"run.eval_every={eval_every}",
                  "--set", f"run.run_dir={tmp_path}"])
  out = capsys.readouterr().out
  assert f"done: 8 steps (steps); {last_words}\n" in out and "nan" not in out
