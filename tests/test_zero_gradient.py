"""A run whose policy gradient is exactly 0 says so, and why (#49 item 8): synthetic
metrics rows of the keys the learner step writes (sao_jax.learner.step)."""

import pytest

from sao_jax.run import zero_gradient
from sao_jax.run.zero_gradient import WINDOW, ZeroGradientWatch


def _row(grad_norm=0.0, **keys):
  row = {"policy/grad_norm": grad_norm, "reward/mean": 0.0, "tokens/action": 40.0,
         "advantage/zero_traj_frac": 0.0, "policy/kept_frac": 0.9, "policy/loss": 0.0}
  row.update({key.replace("__", "/"): value for key, value in keys.items()})
  return row


def _feed(watch, rows, start=0):
  return [watch.observe(step, row) for step, row in enumerate(rows, start)]


def test_all_equal_rewards_warn_once_after_the_window_naming_the_cause():
  # A group variant whose rewards are always 0: every advantage is 0, the gradient exactly 0.
  watch = ZeroGradientWatch(value_only_steps=0, total_steps=100)
  lines = _feed(watch, [_row(advantage__zero_traj_frac=1.0)] * (WINDOW + 3))
  assert lines[:WINDOW - 1] == [None] * (WINDOW - 1) and lines[WINDOW:] == [None] * 3
  assert lines[WINDOW - 1] == (
      f"warning: policy/grad_norm has been exactly 0 on the {WINDOW} learner steps "
      f"0..{WINDOW - 1} (metrics rows): the policy did not change. Why: {WINDOW} x "
      + zero_gradient.CAUSES[2][1] + ". reward/mean was 0.000 on each")


def test_a_nonzero_gradient_ends_the_run_of_zero_steps():
  watch = ZeroGradientWatch(value_only_steps=0, total_steps=100)
  rows = [_row()] * (WINDOW - 1) + [_row(grad_norm=0.3)] + [_row()] * (WINDOW - 1)
  assert _feed(watch, rows) == [None] * len(rows)
  line = watch.observe(len(rows), _row())  # the second run reaches the window: a new warning
  assert line.startswith(f"warning: policy/grad_norm has been exactly 0 on the {WINDOW} "
                         f"learner steps {WINDOW}..{2 * WINDOW - 1}")
  assert line.endswith("no cause the step's metrics show (policy/loss 0). reward/mean was "
                       "0.000 on each")


def test_the_critic_warm_up_is_expected_when_the_run_goes_beyond_it():
  watch = ZeroGradientWatch(value_only_steps=10, total_steps=100)
  assert _feed(watch, [_row()] * 10) == [None] * 10  # value-only: no warning
  # Policy steps after it count: the warning comes at the WINDOW-th of them and lists both.
  lines = _feed(watch, [_row(policy__no_contrast_skip=1.0, reward__mean=1.0)] * WINDOW, start=10)
  assert lines[:-1] == [None] * (WINDOW - 1)
  assert f"on the {10 + WINDOW} learner steps 0..{9 + WINDOW}" in lines[-1]
  assert (f"Why: 10 x value-only steps of the critic's warm-up (the first 10: "
          "learner.value_pretrain_steps + learner.critic_warmup_steps); "
          f"{WINDOW} x every trajectory of the batch earned the same reward, so "
          "algorithm.require_reward_contrast skipped the update. reward/mean ranged 0.000 to "
          "1.000") in lines[-1]


def test_a_run_that_ends_inside_the_warm_up_is_told_how_to_get_out():
  # The run: 8 steps under the default critic_warmup_steps=10.
  watch = ZeroGradientWatch(value_only_steps=10, total_steps=8)
  lines = _feed(watch, [_row()] * 8)
  assert lines[WINDOW - 1].endswith(
      f"Why: {WINDOW} x value-only steps of the critic's warm-up (the first 10: "
      "learner.value_pretrain_steps + learner.critic_warmup_steps), which outlast the run's "
      "learner.steps=8; raise learner.steps or lower learner.critic_warmup_steps. "
      "reward/mean was 0.000 on each")
  assert [line for line in lines if line] == [lines[WINDOW - 1]]


@pytest.mark.parametrize("keys, cause", [
    ({"tokens/action": 0.0}, 1),
    ({"policy/kept_frac": 0.0}, 3),
    ({"policy/kept_frac": None, "policy/clip_frac": 1.0}, 4),
])
def test_masked_batches_are_named(keys, cause):
  watch = ZeroGradientWatch(value_only_steps=0, total_steps=100)
  row = {k: v for k, v in {**_row(), **keys}.items() if v is not None}
  line = _feed(watch, [row] * WINDOW)[-1]
  assert f"Why: {WINDOW} x {zero_gradient.CAUSES[cause][1]}." in line


def test_rows_without_a_policy_gradient_are_passed_over():
  # Evaluation and SFT rows carry no policy/grad_norm; they neither count nor reset.
  watch = ZeroGradientWatch(value_only_steps=0, total_steps=100)
  assert _feed(watch, [_row()] * (WINDOW - 1)) == [None] * (WINDOW - 1)
  assert watch.observe(WINDOW, {"eval/accuracy": 0.0}) is None
  assert watch.observe(WINDOW - 1, _row()).startswith("warning: policy/grad_norm")
