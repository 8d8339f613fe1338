"""The documentation site builds strictly and every page is reachable (issue #37).

`mkdocs build --strict` (what `make docs` runs) fails on a broken link, a broken
anchor or a nav entry without a page; the nav check here adds the converse, a
page the navigation does not reach. The README stays a landing page.
"""

import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import packaging.requirements
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _nav_pages(entries) -> list[str]:
  out = []
  for entry in entries:
    value = next(iter(entry.values())) if isinstance(entry, dict) else entry
    out += _nav_pages(value) if isinstance(value, list) else [value]
  return out


class _Loader(yaml.SafeLoader):
  """mkdocs.yml's `!!python/name:` tags (superfences' mermaid formatter) read as names."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/name:",
                              lambda loader, suffix, node: suffix)
# `!ENV [NAME, ...]` (repo_url): read as the names, not resolved.
_Loader.add_constructor("!ENV", lambda loader, node: loader.construct_sequence(node))
REPO_URL = "https://example.org/sao_jax"  # what a publisher sets, for the build below


def _mkdocs_config() -> dict:
  return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
  """The site as `make docs` builds it (once per module: a build takes ~30 s here)."""
  out = tmp_path_factory.mktemp("site") / "site"
  result = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
      cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
      env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "SAO_JAX_REPO_URL": REPO_URL})
  assert result.returncode == 0, result.stdout + result.stderr
  return out


def test_the_site_builds_strictly(site):
  assert (site / "reference" / "config" / "index.html").is_file()
  # CONTRIBUTING.md is included into the site, not copied.
  contributing = (site / "contributing" / "index.html").read_text()
  assert "Adding an environment" in contributing


def test_the_repository_link_is_the_publishers(site, monkeypatch):
  """`repo_url` comes from SAO_JAX_REPO_URL (mkdocs.yml's `!ENV`): every page links to it
  when a publisher sets it (the build above), and there is no link when it is unset."""
  from mkdocs.config import load_config  # pylint: disable=import-outside-toplevel

  for page in ("index.html", "guides/training-runs/index.html"):
    assert f'href="{REPO_URL}"' in (site / page).read_text(), page
  monkeypatch.delenv("SAO_JAX_REPO_URL", raising=False)
  assert load_config(str(ROOT / "mkdocs.yml"))["repo_url"] is None
  monkeypatch.setenv("SAO_JAX_REPO_URL", "https://github.com/someone/sao_jax")
  assert load_config(str(ROOT / "mkdocs.yml"))["repo_url"] == "https://github.com/someone/sao_jax"


def test_the_site_draws_diagrams_and_math_without_a_network(site):
  """Diagrams and equations render from the vendored mermaid.js and KaTeX: no page
  loads a script, stylesheet or font from another host (the theme's Google Fonts
  are off, and mermaid.js is defined before the theme would fetch it from unpkg)."""
  pages = {p.relative_to(site).as_posix(): p.read_text() for p in site.rglob("*.html")}
  remote = {}
  for name, html in pages.items():
    found = re.findall(r'<script\b[^>]*\bsrc="(?:https?:)?//[^"]*"', html)
    found += [tag for tag in re.findall(r"<link\b[^>]*>", html)
              if re.search(r'href="(?:https?:)?//', tag)
              and re.search(r'rel="(?:stylesheet|preconnect|preload)"', tag)]
    if found:
      remote[name] = found
  assert not remote, f"pages that load from the network: {remote}"
  algorithm = pages["algorithm/index.html"]
  assert algorithm.count('class="arithmatex"') >= 12 and "\\tag{2.3}" in algorithm
  for page in ("explanation/architecture", "explanation/data-path",
               "explanation/episode-lifecycle", "explanation/peers"):
    html = pages[f"{page}/index.html"]
    assert '<pre class="mermaid"><code>' in html, f"{page}: no diagram"
    assert "assets/vendor/mermaid/mermaid.min.js" in html
  css = (site / "assets/vendor/katex/katex.min.css").read_text()
  fonts = set(re.findall(r"url\((fonts/[^)]+\.woff2)\)", css))
  assert len(fonts) >= 20
  assert all((site / "assets/vendor/katex" / font).is_file() for font in fonts)


def _rule(makefile: str, target: str) -> tuple[list[str], list[str]]:
  """(prerequisites, recipe lines) of one Makefile rule."""
  match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", makefile, re.M)
  assert match, f"no rule for {target} in the Makefile"
  return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]


def test_make_docs_installs_the_docs_extra_alone():
  """`make docs` and `make docs-serve` need mkdocs, not torch: they install `.[docs]`,
  and every theme and Markdown extension mkdocs.yml names comes with that extra."""
  makefile = (ROOT / "Makefile").read_text()
  for target in ("docs", "docs-serve"):
    prerequisites, _ = _rule(makefile, target)
    installs = []
    for prerequisite in prerequisites:  # a stamp's rule is named as written: $(DOCS_STAMP)
      installs += [line for line in _rule(makefile, prerequisite)[1] if "pip install" in line]
    extras = [re.search(r"-e '\.\[([a-z,]+)\]'", line).group(1) for line in installs
              if "-e '." in line]
    assert extras == ["docs"], f"make {target} installs the extras {extras}, want only docs"
  docs = {re.match(r"[A-Za-z0-9_.-]+", r).group(0)
          for r in tomllib.loads((ROOT / "pyproject.toml").read_text())
          ["project"]["optional-dependencies"]["docs"]}
  provided = _dependency_closure(docs)
  config = _mkdocs_config()
  modules = {"material"} | {next(iter(e)) if isinstance(e, dict) else e
                             for e in config["markdown_extensions"]}
  for module in sorted(modules):
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or module in ("admonition", "attr_list", "tables", "toc"):
      continue  # Python-Markdown's own extensions
    owners = {_normal(d) for d in importlib.metadata.packages_distributions().get(top, [])}
    assert owners & provided, f"mkdocs.yml uses {module!r}, which the docs extra does not bring"


def _normal(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def _dependency_closure(names: set[str]) -> set[str]:
  """The distributions `names` require here, transitively: requirements whose markers
  hold on this interpreter, without any extra's."""
  seen, todo = set(), [_normal(n) for n in names]
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    for text in importlib.metadata.requires(name) or []:
      requirement = packaging.requirements.Requirement(text)
      if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
        todo.append(_normal(requirement.name))
  return seen


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
