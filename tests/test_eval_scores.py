"""Benchmark scores: the unbiased pass@k estimator against a brute-force count,
per-source aggregation and the printed table."""

import itertools

import pytest

from sao_jax.jobs import eval_scores
from sao_jax.jobs.eval_scores import TaskScore


def brute_force_pass_at_k(n, c, k):
  """Share of the k-subsets of n samples (c of them successes) holding a success."""
  outcomes = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(outcomes[i] for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_the_brute_force_count(n):
  for c in range(n + 1):
    for k in range(1, n + 1):
      assert eval_scores.pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k),
                                                             rel=1e-12, abs=1e-15)


def test_pass_at_k_special_cases_and_large_n():
  assert eval_scores.pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n
  assert eval_scores.pass_at_k(10, 0, 10) == 0.0 and eval_scores.pass_at_k(10, 1, 10) == 1.0
  # Exact binomials: no overflow or cancellation at n = 1000.
  assert eval_scores.pass_at_k(1000, 1, 1) == pytest.approx(1e-3, rel=1e-12)
  for bad in [(4, 5, 1), (4, 2, 0), (4, 2, 5), (4, -1, 1)]:
    with pytest.raises(ValueError, match="pass@k needs"):
      eval_scores.pass_at_k(*bad)


def test_summary_per_source_and_table():
  scores = [TaskScore("gsm8k", True, 4, 4), TaskScore("gsm8k", False, 4, 1, failures=1),
            TaskScore("aime", False, 4, 0)]
  summary = eval_scores.summarize(scores, ks=(1, 2))
  gsm8k = summary["sources"]["gsm8k"]
  assert gsm8k == {"tasks": 2, "greedy_pass@1": 0.5, "failures": 1, "mean@4": 0.625,
                   "pass@1": pytest.approx(0.625), "pass@2": pytest.approx((1 + 0.5) / 2)}
  assert summary["sources"]["aime"]["pass@2"] == 0.0
  overall = summary["overall"]
  assert overall["tasks"] == 3 and overall["mean@4"] == pytest.approx(5 / 12)
  assert overall["greedy_pass@1"] == pytest.approx(1 / 3)
  table = eval_scores.format_table(summary).splitlines()
  assert table[0].split() == ["source", "tasks", "greedy_pass@1", "failures", "mean@4",
                              "pass@1", "pass@2"]
  assert [line.split()[0] for line in table[2:]] == ["aime", "gsm8k", "all"]
  assert table[3].split() == ["gsm8k", "2", "0.5000", "1", "0.6250", "0.6250", "0.7500"]


def test_a_dataset_s_source_names_cannot_drive_the_terminal_or_widen_the_table():
  # sao-eval printed the source column's cells raw: a dataset file could erase the
  # table's lines and print its own ("all  1.0000"), or make every row a megabyte wide.
  forged = "\x1b[1A\x1b[2K\rall 100 1.0000 0\n\x1b]52;c;cm0gLXJmIH4=\x07"
  summary = eval_scores.summarize([TaskScore(forged, False), TaskScore("x" * 1_000_000, True)],
                                  ks=())
  table = eval_scores.format_table(summary)
  assert "\x1b" not in table and "\r" not in table and "\\x1b]52;c;" in table
  lines = table.splitlines()
  assert len(lines) == 5 and max(map(len, lines)) < 200
  assert [line.split()[0] for line in lines[2:]][-1] == "all"


def test_greedy_only_summary_has_no_sampled_metrics():
  summary = eval_scores.summarize([TaskScore("a", True), TaskScore("a", False)], ks=())
  assert summary["overall"] == {"tasks": 2, "greedy_pass@1": 0.5, "failures": 0}
  with pytest.raises(ValueError, match="no tasks"):
    eval_scores.summarize([], ks=())
