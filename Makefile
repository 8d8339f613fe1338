# Set-up and checks. Every target creates .venv and installs what it needs, so a
# fresh clone needs nothing but python3 (>= 3.11) and make.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: test test-all bench demo clean bubblewrap

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

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

## test: the default suite (what CI runs); slow-marked checks excluded.
test: $(STAMP) bubblewrap
	$(PY) -m pytest -q --durations=25

## test-all: every test, including those marked slow.
test-all: $(STAMP)
	$(PY) -m pytest -q -m "slow or not slow"

## demo: the CPU demo (configs/demo_cpu.py) in a fresh runs/demo_cpu-<time> directory.
demo: $(STAMP) bubblewrap
	$(VENV)/bin/sao-train --config configs/demo_cpu.py --set run.run_dir=runs/demo_cpu-$$(date +%Y%m%d-%H%M%S)

## bench: every benchmark in benchmarks/, each ending with a RESULT line.
bench: $(STAMP)
	set -e; for script in benchmarks/*.py; do echo "== $$script"; $(PY) $$script; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs
