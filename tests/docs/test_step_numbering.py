"""Checkpoint directories count steps done, metrics rows count from 0 (#49 item 9): the
numbering is kept (existing checkpoints resume), so the pages where both appear say it."""

import pathlib

from sao_jax.cli import docsgen

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _flat(text: str) -> str:
  return " ".join(text.split())


def test_the_training_guide_says_how_rows_and_checkpoints_are_numbered():
  text = _flat((ROOT / "docs" / "guides" / "training-runs.md").read_text())
  assert ("`checkpoints/8` holds the state after the steps of rows 0 to 7, its evaluation row "
          "has `step` 8") in text
  assert "a run resumed from it logs row 8 next" in text


def test_the_resume_guide_says_which_row_a_resumed_run_logs_first():
  text = _flat((ROOT / "docs" / "guides" / "resume-and-preemption.md").read_text())
  assert ("checkpoint `c` holds the state after rows `0..c-1` and the first row trained "
          "again is row `c`") in text


def test_the_metrics_reference_says_what_step_counts():
  # Generated from docsgen: the `step` key is described in its introduction.
  text = _flat(docsgen.render_metrics())
  assert "Learner rows carry `step` (the step's index, from 0)" in text
  assert "`checkpoints/8` holds the state after rows 0 to 7" in text
