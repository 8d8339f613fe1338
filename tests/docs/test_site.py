"""The documentation site builds strictly and every page is reachable (issue #37).

`mkdocs build --strict` (what `make docs` runs) fails on a broken link, a broken
anchor or a nav entry without a page; the nav check here adds the converse, a
page the navigation does not reach. The README stays a landing page.
"""

import os
import pathlib
import re
import subprocess
import sys
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _nav_pages(entries) -> list[str]:
  out = []
  for entry in entries:
    value = next(iter(entry.values())) if isinstance(entry, dict) else entry
    out += _nav_pages(value) if isinstance(value, list) else [value]
  return out


def _mkdocs_config() -> dict:
  return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_the_site_builds_strictly(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
      cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
      env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
  assert result.returncode == 0, result.stdout + result.stderr
  assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()
  # CONTRIBUTING.md is included into the site, not copied.
  contributing = (tmp_path / "site" / "contributing" / "index.html").read_text()
  assert "Adding an environment" in contributing


def test_every_page_is_in_the_navigation():
  config = _mkdocs_config()
  excluded = [line.strip() for line in config.get("exclude_docs", "").splitlines() if line.strip()]
  pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
           if not any(p.relative_to(DOCS).as_posix().startswith(e) for e in excluded)}
  nav = set(_nav_pages(config["nav"]))
  assert not pages - nav, f"add these pages to mkdocs.yml's nav: {sorted(pages - nav)}"


def test_the_navigation_answers_a_newcomers_questions():
  """The questions of issue #37, each answered by a page the nav names."""
  nav = " ".join(f"{k} {v}" for k, v in _flatten(_mkdocs_config()["nav"])).lower()
  for topic in ("demo", "install", "tpu", "multi-host", "lora", "tracking", "sandbox",
                "metrics", "config", "algorithm", "architecture", "trust", "claims"):
    assert topic in nav, topic


def _flatten(entries):
  for entry in entries:
    if isinstance(entry, dict):
      for key, value in entry.items():
        if isinstance(value, list):
          yield from _flatten(value)
        else:
          yield key, value


def test_the_readme_is_a_landing_page_whose_links_resolve():
  text = (ROOT / "README.md").read_text()
  assert len(text.splitlines()) <= 250
  targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
  assert len(targets) >= 20
  missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
  assert not missing, f"README links to files that do not exist: {missing}"


def test_the_license_is_apache_2():
  text = (ROOT / "LICENSE").read_text()
  assert "Apache License" in text and "Version 2.0, January 2004" in text
  assert "END OF TERMS AND CONDITIONS" in text
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]


def test_every_repository_path_the_docs_quote_exists():
  """`sao_jax/channel/transport.py` in a page must be a file: a moved module leaves no
  page pointing at where it was."""
  quoted = set()
  for page in [*DOCS.rglob("*.md"), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]:
    quoted |= {(page.relative_to(ROOT).as_posix(), path) for path in re.findall(
        r"`((?:sao_jax|tests|configs|benchmarks|experiments|tpu_scripts)/[A-Za-z0-9_./-]+)",
        page.read_text())}
  assert len(quoted) > 100
  missing = sorted((page, path) for page, path in quoted if not (ROOT / path).exists())
  assert not missing, f"these pages quote paths that do not exist: {missing}"
