"""Every `docs/algorithm.md §N` a file of the repository cites is a section that exists.

The code cites the algorithm by section number (`docs/algorithm.md §3`, a range
`§2-§5`, or a bare `(§5)` after a citation on the same line). A renumbered or
deleted section would leave those citations pointing nowhere, which is what
happened when the code cited a file outside the repository.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALGORITHM = ROOT / "docs" / "algorithm.md"
# Trees whose files may cite the algorithm: code, tests, scripts and configs.
CITING_TREES = ("sao_jax", "tests", "experiments", "benchmarks", "configs")
CITATION = re.compile(r"algorithm\.md((?:[ ,]*(?:§\d+(?:\s*-\s*§\d+)?)(?:,? and)?)+)")
SECTION_NUMBER = re.compile(r"§(\d+)")


def _sections() -> set[int]:
  return {int(n) for n in re.findall(r"^## §(\d+) ", ALGORITHM.read_text(), re.M)}


def _citations() -> list[tuple[str, int, int]]:
  """(file:line, cited section) for every citation in the citing trees."""
  found = []
  for tree in CITING_TREES:
    for path in sorted((ROOT / tree).rglob("*.py")):
      if path == pathlib.Path(__file__):  # its own examples cite a missing section on purpose
        continue
      for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for match in CITATION.finditer(line):
          for section in SECTION_NUMBER.findall(match.group(1)):
            found.append((f"{path.relative_to(ROOT)}:{number}", int(section)))
  return found


def test_sections_are_numbered_in_order():
  numbers = [int(n) for n in re.findall(r"^## §(\d+) ", ALGORITHM.read_text(), re.M)]
  assert numbers == list(range(1, len(numbers) + 1)), numbers


def test_every_cited_section_exists():
  sections = _sections()
  citations = _citations()
  assert len(citations) >= 40, f"expected the code's ~50 citations, found {len(citations)}"
  missing = [(where, n) for where, n in citations if n not in sections]
  assert not missing, (f"these cite sections docs/algorithm.md does not have (it has "
                       f"{sorted(sections)}): {missing}")


def test_a_missing_section_is_caught(tmp_path):
  """The check itself: a citation of a section the page lacks is reported."""
  line = "See docs/algorithm.md §2-§5 and docs/algorithm.md §42."
  cited = [int(n) for m in CITATION.finditer(line) for n in SECTION_NUMBER.findall(m.group(1))]
  assert cited == [2, 5, 42]
  assert 42 not in _sections()


def test_no_file_cites_the_paper_notes_outside_the_repository():
  """The code used to cite `SAO.md`, a file a clone does not have."""
  offenders = []
  for tree in CITING_TREES:
    for path in (ROOT / tree).rglob("*.py"):
      if path == pathlib.Path(__file__):
        continue
      if re.search(r"\bSAO\.md\b", path.read_text(encoding="utf-8")):
        offenders.append(str(path.relative_to(ROOT)))
  for path in [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]:
    if re.search(r"\bSAO\.md\b|\.\./shared/", path.read_text(encoding="utf-8")):
      offenders.append(str(path.relative_to(ROOT)))
  assert not offenders, f"cite docs/algorithm.md instead of SAO.md in: {sorted(offenders)}"
