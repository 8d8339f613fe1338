"""The README and the docs home page say the same about SAO against GRPO, and say for
each result the setting it holds for, with the figures the generated reports
(docs/research/e1.md, e2.md, from the runs' configs) state; and they list the same
pieces as working and the same as not yet built."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parents[2]
START, END = "<!-- sao-vs-grpo:", "<!-- /sao-vs-grpo -->"


def _block(path: pathlib.Path) -> str:
  text = path.read_text()
  assert text.count(START) == 1 and text.count(END) == 1, f"{path}: one {START} block"
  return " ".join(text[text.index(START):text.index(END)].split()[1:])  # words, one space


def _setting(report: str) -> dict[str, str]:
  """The subject arm's figures from a report's "The result holds for:" line."""
  line = next(line for line in (ROOT / "docs" / "research" / report).read_text().splitlines()
              if line.startswith("The result holds for:"))
  found = re.search(r"policy lr (\S+) .*?critic lr \S+ \((\S+)x the policy's.*?"
                    r"(\d+) value pretraining steps, (\d+) critic warm-up steps", line)
  # E1, E2: a critic check added after the registration; E3: registered, in the verdict.
  critic = next(line for line in (ROOT / "docs" / "research" / report).read_text().splitlines()
                if "critic's explained variance after warm-up" in line)
  median = re.search(r"critic's explained variance after warm-up.*?median over \d+ seeds (\S+) ",
                     critic).group(1)
  return {"lr": found[1], "ratio": found[2], "pretrain": found[3], "warmup": found[4],
          "median": median}


def test_the_readme_and_the_home_page_agree():
  readme, home = _block(ROOT / "README.md"), _block(ROOT / "docs" / "index.md")
  assert readme == home


# Each result's words run from its name to the next one's; how it was compared; how its
# critic's median explained variance is worded.
RESULTS = {"E1": ("e1.md", "E2 (pre-registered", "per learner step, not wall-clock",
                  "explained a median"),
           "E2": ("e2.md", "E3 (pre-registered", "per learner step, not wall-clock",
                  "explained variance after warm-up was"),
           "E3": ("e3.md", "E1-paper", "compared by wall-clock", "explained a median")}


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_each_result_names_the_setting_its_report_holds_for(name):
  report, until, compared, explained = RESULTS[name]
  block = _block(ROOT / "README.md")
  part = block[block.index(f"{name} (pre-registered"):]
  part = part[:part.index(until)]
  want = _setting(report)
  assert f"policy lr {want['lr']}" in part
  assert f"critic at {want['ratio']}x the policy lr" in part
  assert ("no value pretraining" if want["pretrain"] == "0"
          else f"{want['pretrain']} value pretraining steps") in part
  assert f"{want['warmup']} critic warm-up steps" in part
  assert compared in part
  assert f"{explained} {want['median']}" in part


WORKS_START, WORKS_END = "<!-- what-works:", "<!-- /what-works -->"


def _works(path: pathlib.Path) -> str:
  text = path.read_text()
  assert text.count(WORKS_START) == 1 and text.count(WORKS_END) == 1, \
      f"{path}: one {WORKS_START} block"
  return text[text.index(WORKS_START):text.index(WORKS_END)]


def _rows(block: str) -> dict[str, str]:
  return {line.split("|")[1].strip(): line.split("|")[2].strip()
          for line in block.splitlines() if line.startswith("| ") and "---" not in line}


def test_the_readme_and_the_home_page_list_the_same_as_working_and_as_not_yet():
  """One table, in both: the README's links point into docs/, the home page's are
  relative to it, and nothing else may differ (the home page once listed the pool
  split over the sampler's batch axes as "not yet" after the README called it built)."""
  readme, home = _works(ROOT / "README.md"), _works(ROOT / "docs" / "index.md")
  assert readme.replace("](docs/", "](") == home
  rows = _rows(home)
  assert {"Sampler", "Environments", "Runs", "Not yet"} <= set(rows), sorted(rows)
  links = re.findall(r"\]\(([^)#\s]+)", home)
  assert links and all((ROOT / "docs" / link).is_file() for link in links), links
  built = rows["Sampler"]
  assert "pool split over the sampler mesh's data axes" in built
  assert "pool split" not in rows["Not yet"]
