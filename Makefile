# Set-up and checks. Every target creates .venv and installs what it needs, so a
# fresh clone needs nothing but python3 (>= 3.11) and make.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
TPU_STAMP := $(VENV)/.installed-tpu
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: test test-unit test-all bench demo docs docs-serve clean bubblewrap

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## The docs extra alone (mkdocs, mkdocs-material): what `make docs` needs, and no
## torch or transformers. A .venv that already has the dev extra has it too.
$(DOCS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

## libtpu at jax's version (the `tpu` extra), for the benchmarks that compile for a TPU
## topology on any machine (aot_plan.py, paged_prefill.py); no TPU needed.
$(TPU_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,tpu]'
	touch $(TPU_STAMP)

## bubblewrap: the kernel sandbox every tool call runs in (env.sandbox="bwrap");
## installed with apt-get when missing and root, else a message saying how; then
## the interpreter is made reachable for the sandbox's unprivileged user and the
## sandbox self-test reports (sao_jax.envs.sandbox.prepare).
bubblewrap: $(STAMP)
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; \
	  else \
	    echo "bubblewrap (bwrap) is missing: install it with 'sudo apt-get install bubblewrap';" \
	      "tool calls are refused without it (unless env.sandbox='unisolated')" >&2; \
	  fi; }
	@$(PY) -m sao_jax.envs.sandbox.prepare

## Parallel test workers (pytest-xdist): one per core, at most 4 (each worker is a
## JAX runtime of ~1 GB with 8 emulated devices). `make test TEST_WORKERS=0` runs in
## one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(os.cpu_count() or 1, 4))")

## test: the default suite (what CI runs); slow-marked checks excluded; the 25
## slowest tests are listed at the end.
test: $(STAMP) bubblewrap
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=25

## test-unit: the unit tier alone (one process, in memory), the fast inner loop.
test-unit: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "unit and not slow"

## test-all: every test, including those marked slow.
test-all: $(STAMP) bubblewrap
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=25 -m "slow or not slow"

## demo: the CPU demo (configs/demo_cpu.py) in a fresh runs/demo_cpu-<time> directory.
demo: $(STAMP) bubblewrap
	$(VENV)/bin/sao-train --config configs/demo_cpu.py --set run.run_dir=runs/demo_cpu-$$(date +%Y%m%d-%H%M%S)

## bench: every benchmark in benchmarks/, each ending with a RESULT line (the coding
## environment's needs bubblewrap, the TPU plans libtpu).
bench: $(TPU_STAMP) bubblewrap
	set -e; for script in benchmarks/*.py; do echo "== $$script"; $(PY) $$script; done

## docs: build the documentation site into site/ (mkdocs.yml); --strict fails on a
## broken link, a missing page or a reference page that differs from the code.
docs: $(DOCS_STAMP)
	$(PY) -m sao_jax.cli.docsgen --check
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

## docs-serve: serve the site on http://127.0.0.1:8000, rebuilt on every edit.
docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs site
