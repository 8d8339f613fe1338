"""Benchmark scores from per-task outcomes: greedy pass@1, mean@n, unbiased pass@k.

For each task, `TaskScore` holds whether the greedy episode succeeded and how
many `c` of `n` sampled episodes did (success = full reward: a verified answer
in math). Over the tasks of a group (all, or one source):

- `greedy_pass@1` = mean of greedy successes;
- `mean@n` = mean of c / n (expected accuracy of one sample, averaged over n);
- `pass@k` = mean of the unbiased estimator (Chen et al. 2021, "Evaluating Large
  Language Models Trained on Code", eq. 1) for k <= n:

      pass@k = 1 - C(n - c, k) / C(n, k)

  the probability that at least one of k samples drawn without replacement from
  the n is a success (1 when n - c < k). It is computed with exact integer
  binomials, rounded once.

Episodes the environment could not judge (env failures) count as failures and
are reported in `failures`; `format_table` lists each kind with its first message
(`failure_lines`, from the report's "failure_reasons").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

from sao_jax.log_text import untrusted

SOURCE_CHARS = 60  # of a source's name in `format_table`


@dataclasses.dataclass(frozen=True)
class TaskScore:
  source: str
  greedy_success: bool
  samples: int = 0  # n
  successes: int = 0  # c of the n
  failures: int = 0  # episodes (greedy and sampled) the environment could not judge


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from `c` successes in `n` samples: 1 - C(n-c, k) / C(n, k)."""
  if not 0 <= c <= n or not 1 <= k <= n:
    raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
  if n - c < k:
    return 1.0
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def group_scores(scores: Sequence[TaskScore], ks: Sequence[int]) -> dict[str, float]:
  """The metrics of the module docstring over `scores` (one group of tasks)."""
  out = {"tasks": len(scores),
         "greedy_pass@1": sum(s.greedy_success for s in scores) / len(scores),
         "failures": sum(s.failures for s in scores)}
  n = scores[0].samples
  if n:
    out[f"mean@{n}"] = sum(s.successes / n for s in scores) / len(scores)
    for k in ks:
      out[f"pass@{k}"] = sum(pass_at_k(n, s.successes, k) for s in scores) / len(scores)
  return out


def summarize(scores: Iterable[TaskScore], ks: Sequence[int]) -> dict:
  """{"overall": group_scores(all), "sources": {source: group_scores(its tasks)}}."""
  scores = list(scores)
  if not scores:
    raise ValueError("no tasks were evaluated")
  by_source: dict[str, list[TaskScore]] = {}
  for score in scores:
    by_source.setdefault(score.source, []).append(score)
  return {"overall": group_scores(scores, ks),
          "sources": {name: group_scores(group, ks) for name, group in sorted(by_source.items())}}


def format_table(summary: dict) -> str:
  """The summary as a fixed-width text table: one row per source, then `all`.

  A source's name is a dataset cell (`env.dataset.source_column`): shown as one
  printable line (`log_text.untrusted`), its first `SOURCE_CHARS` characters, so a
  cell can neither drive the terminal nor widen every row; the report keeps it whole.
  """
  columns = list(summary["overall"])
  rows = [(untrusted(name, SOURCE_CHARS), group) for name, group in summary["sources"].items()]
  rows.append(("all", summary["overall"]))
  width = max(len("source"), *(len(name) for name, _ in rows))
  widths = [max(10, len(c)) + 2 for c in columns]
  cell = lambda v, w: f"{v:>{w}d}" if isinstance(v, int) else f"{v:>{w}.4f}"
  lines = [f"{'source':<{width}}" + "".join(f"{c:>{w}}" for c, w in zip(columns, widths))]
  lines.append("-" * len(lines[0]))
  lines += [f"{name:<{width}}" + "".join(cell(group[c], w) for c, w in zip(columns, widths))
            for name, group in rows]
  return "\n".join(lines + failure_lines(summary.get("failure_reasons", {})))


def failure_lines(reasons: dict[str, dict]) -> list[str]:
  """One line per failure kind of a report: its count and first message (already one
  printable line, `pipeline.Drops`), so the table says why episodes were not judged."""
  if not reasons:
    return []
  return ["failures by kind (counted as unsolved):"] + [
      f"  {untrusted(kind, SOURCE_CHARS)} {reason['count']} (first: {reason['first_message']})"
      for kind, reason in reasons.items()]
