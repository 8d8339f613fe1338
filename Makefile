# Set-up and checks. Every target creates .venv and installs what it needs, so a
# fresh clone needs nothing but python3 (>= 3.11) and make.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: test test-all bench demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## test: the default suite (what CI runs); slow-marked checks excluded.
test: $(STAMP)
	$(PY) -m pytest -q

## test-all: every test, including those marked slow.
test-all: $(STAMP)
	$(PY) -m pytest -q -m "slow or not slow"

## demo: the CPU demo (configs/demo_cpu.py) in a fresh runs/demo_cpu-<time> directory.
demo: $(STAMP)
	$(VENV)/bin/sao-train --config configs/demo_cpu.py --set run.run_dir=runs/demo_cpu-$$(date +%Y%m%d-%H%M%S)

## bench: every benchmark in benchmarks/, each ending with a RESULT line.
bench: $(STAMP)
	set -e; for script in benchmarks/*.py; do echo "== $$script"; $(PY) $$script; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs
