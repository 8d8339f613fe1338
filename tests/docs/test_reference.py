"""The generated reference pages (docs/reference/{config,metrics,cli}.md) match the code,
and every config field and every metric key has a description (issue #37)."""

import dataclasses
import functools
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import config as C
from sao_jax.cli import docsgen
from sao_jax.data.pipeline import BatchInfo, Drops
from sao_jax.learner import state as state_lib
from sao_jax.learner.step import StepConfig, train_step
from sao_jax.run import metric_docs
from sao_jax.run.metrics import batch_metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "learner"))
from learner_fixtures import MODEL, make_batch, make_config  # noqa: E402


def test_committed_reference_pages_are_current():
  stale = docsgen.stale_pages()
  assert not stale, (f"docs/reference/{stale} differ from what the code generates; run "
                     "`python -m sao_jax.cli.docsgen` and commit the pages")


def test_stale_pages_notices_an_edit(tmp_path):
  for name, render in docsgen.PAGES.items():
    (tmp_path / name).write_text(render())
  assert docsgen.stale_pages(tmp_path) == []
  (tmp_path / "config.md").write_text(docsgen.render_config().replace("| `seed` |", "| `sed` |"))
  assert docsgen.stale_pages(tmp_path) == ["config.md"]


def test_every_config_field_has_a_description():
  fields = list(docsgen.config_fields())
  assert len(fields) > 150
  missing = [f.path for f in fields if not f.meaning]
  assert not missing, ("add a comment beside (or right above) these fields in "
                       f"sao_jax/config/: {missing}")


def test_every_section_and_field_is_on_the_page():
  page = (ROOT / "docs" / "reference" / "config.md").read_text()
  for field in docsgen.config_fields():
    assert f"| `{field.path}` |" in page
  for name, _ in docsgen.section_docs():
    assert f"\n## {name}\n" in page


@dataclasses.dataclass(frozen=True)
class _Commented:
  trailing: int = 1  # said at the end of its line
  # said on the line
  # above it
  above: int = 2
  bare: int = 3


def test_field_descriptions_come_from_the_fields_comments():
  comments = docsgen._field_comments(_Commented)  # pylint: disable=protected-access
  assert comments == {"trailing": "said at the end of its line", "above": "said on the line above it",
                      "bare": ""}


def test_allowed_values_come_from_validate():
  allowed = {f.path: f.allowed for f in docsgen.config_fields()}
  assert allowed["algorithm.variant"] == ", ".join(repr(v) for v in C.VARIANTS)
  assert allowed["sampler.kv_layout"] == "'dense', 'paged'"
  assert allowed["learner.steps"] == ""


# -- metrics ----------------------------------------------------------------------------


def test_every_metric_entry_is_complete_and_unique():
  keys = [doc.key for doc in metric_docs.METRICS]
  assert len(keys) == len(set(keys))
  for doc in metric_docs.METRICS:
    assert doc.meaning and doc.unit and doc.when, doc


def test_describe_matches_keys_and_patterns():
  assert metric_docs.describe("policy/loss").key == "policy/loss"
  assert metric_docs.describe("staleness/lag_3").key == "staleness/lag_<k>"
  assert metric_docs.describe("staleness/lag_16_plus").key == "staleness/lag_16_plus"
  assert metric_docs.describe("dropped/env_failure/ValueError").key == "dropped/<reason>"
  assert metric_docs.describe("weights/errors/bad_proof").key == "weights/errors/<reason>"
  assert metric_docs.describe("policy/made_up") is None
  assert metric_docs.describe("weights/errors/a/b") is None


def _undocumented(keys):
  return sorted(k for k in keys if metric_docs.describe(k) is None)


@functools.lru_cache(maxsize=None)
def _step_keys(variant: str, **overrides) -> frozenset:
  """The metric keys of one train step, traced (`jax.eval_shape`), never compiled."""
  cfg = make_config(variant)
  if overrides:
    cfg = dataclasses.replace(cfg, **overrides).validate()
  state = jax.eval_shape(lambda: state_lib.init_state(cfg, jax.random.key(0)))
  _, metrics = jax.eval_shape(functools.partial(train_step, cfg=StepConfig.of(cfg)), state,
                              make_batch(0), jnp.asarray(True))
  return frozenset(metrics)


@pytest.mark.parametrize("variant", ["sao", "grpo", "ppo", "running_mean"])
def test_every_metric_the_train_step_writes_is_documented(variant):
  keys = _step_keys(variant)
  assert "policy/loss" in keys and "reward/mean" in keys
  assert not _undocumented(keys), f"add to sao_jax/run/metric_docs.py: {_undocumented(keys)}"


def test_the_optional_step_metrics_are_documented():
  """MoE router metrics and the reward-contrast gate's flag."""
  contrast = make_config("sao").algorithm
  moe = dataclasses.replace(MODEL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
  keys = (_step_keys("sao", model=moe)
          | _step_keys("sao", algorithm=dataclasses.replace(contrast, require_reward_contrast=True)))
  assert {"policy/router_aux_loss", "policy/router_balance", "policy/no_contrast_skip"} <= keys
  assert not _undocumented(keys), f"add to sao_jax/run/metric_docs.py: {_undocumented(keys)}"


def test_every_host_batch_metric_is_documented():
  lags = np.arange(20)
  info = BatchInfo(lags=lags, version_spans=lags % 2, lengths=np.full(20, 8), padding_rows=1,
                   capacity=400, ends=(("max_turns", "stop"), ("truncated", "max_new_tokens")),
                   tool_calls=(1, 0))
  drops = Drops()
  drops.add("stale", 2, "lag 9")
  drops.add("env_failure/ValueError", 1, "boom")
  keys = batch_metrics(info, drops)
  assert "staleness/lag_0" in keys and "staleness/lag_16_plus" in keys
  assert not _undocumented(keys), f"add to sao_jax/run/metric_docs.py: {_undocumented(keys)}"


# Modules that write metric keys as literals: SFT, evaluation, the job's host metrics.
WRITERS = ("sao_jax/learner/sft.py", "sao_jax/jobs/evaluate.py", "sao_jax/jobs/train.py",
           "sao_jax/jobs/warm_start.py", "sao_jax/run/metrics.py", "sao_jax/learner/step.py")
# Intermediate values the step pops before returning its metrics (never logged).
INTERNAL = {"mismatch/lag0_abs_logp_sum"}
KEY_LITERAL = re.compile(r'"((?:sft|eval|reward|policy|value|advantage|staleness|batch|episodes|'
                         r'tokens|response|mismatch)/[a-z0-9_]+)"')


def test_every_metric_key_written_as_a_literal_is_documented():
  keys = set()
  for module in WRITERS:
    keys |= set(KEY_LITERAL.findall((ROOT / module).read_text()))
  assert not INTERNAL & _step_keys("sao")
  keys -= INTERNAL
  assert {"sft/loss", "eval/accuracy", "eval/rl_gain", "batch/padding_frac"} <= keys
  assert not _undocumented(keys), f"add to sao_jax/run/metric_docs.py: {_undocumented(keys)}"


def test_every_score_of_a_sao_eval_report_is_documented():
  from sao_jax.jobs import eval_scores  # pylint: disable=import-outside-toplevel
  scores = [eval_scores.TaskScore(source="a", greedy_success=True, samples=4, successes=2),
            eval_scores.TaskScore(source="b", greedy_success=False, samples=4, successes=0)]
  report = eval_scores.summarize(scores, ks=(1, 4))
  keys = set(report["overall"]) | {k for group in report["sources"].values() for k in group}
  assert {"greedy_pass@1", "mean@4", "pass@4"} <= keys
  undocumented = [k for k in keys if metric_docs.describe(k, metric_docs.EVAL_REPORT) is None]
  assert not undocumented, f"add to sao_jax/metric_docs.EVAL_REPORT: {undocumented}"


# -- command-line tools ----------------------------------------------------------------


def test_every_command_and_flag_is_on_the_page():
  page = (ROOT / "docs" / "reference" / "cli.md").read_text()
  for name, build in docsgen.cli_parsers().items():
    assert f"\n## {name}\n" in page
    parsers = [build(), *docsgen.subcommands(build()).values()]
    for parser in parsers:
      for action in parser._actions:  # pylint: disable=protected-access
        if action.option_strings and action.dest != "help":
          assert f"`{action.option_strings[0]}" in page, (name, action.option_strings)


def test_console_scripts_all_have_a_parser():
  text = (ROOT / "pyproject.toml").read_text()
  scripts = set(re.findall(r'^(sao-[a-z]+) = "', text, re.M))
  assert scripts == set(docsgen.cli_parsers()), scripts
