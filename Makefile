# gpufleet — two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check --no-compile  # .pyc written on first import instead
DEMO_ARGS ?=
PYTEST_ARGS ?=
# test processes for `make test` (pytest-xdist; every Slurm test runs in one of them: tests/conftest.py). 3 on the
# 2-core reference box: most long tests wait on other processes (decision 0122); 0: one process
PYTEST_WORKERS ?= 3

# The compiled engine the compiled-build tests load (tests/integration/compiled): built beside mypy, which
# leaves the second core idle, instead of inside pytest. A failed or impossible build leaves nothing here:
# the tests then build it themselves and say why.
COMPILED_TEST_DIR ?= build/test-compiled

.PHONY: demo test lint typecheck unit bench clean install install-dev wheel wheel-compiled checks test-compiled

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel

# Runtime install (what `make demo` needs): no torch, no dev tools.
$(VENV)/.installed: $(VENV)/bin/python pyproject.toml
	$(PIP) -e .
	@touch $@

# Dev install: torch CPU build pinned FIRST (an unpinned torch pulls GBs of CUDA wheels), then extras.
$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) torch==2.13.0 numpy
	$(PIP) -e '.[dev]'
	@touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(VENV)/bin/gpufleet demo $(DEMO_ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests bench scripts setup.py
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(VENV)/.installed-dev
	$(VENV)/bin/mypy src/gpufleet

# lint, mypy and the compiled build side by side (each one process), output grouped per target
checks: lint typecheck

test-compiled: $(VENV)/.installed-dev
	@rm -rf $(COMPILED_TEST_DIR)
	@$(PY) scripts/compiled_wheel.py --dist $(COMPILED_TEST_DIR)/dist --site $(COMPILED_TEST_DIR)/site >/dev/null 2>&1 \
	  && echo "compiled engine for the tests: $(COMPILED_TEST_DIR)" \
	  || { rm -rf $(COMPILED_TEST_DIR); echo "compiled engine not built here: the compiled tests will build it and say why"; }

test: $(VENV)/.installed-dev
	$(MAKE) --no-print-directory -j3 --output-sync=target checks test-compiled
	GPUFLEET_TEST_COMPILED=$(COMPILED_TEST_DIR) $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

unit: $(VENV)/.installed-dev
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

bench: $(VENV)/.installed-dev
	$(PY) -m bench $(BENCH_ARGS)

# Release wheels into dist/: pure Python, or with the correlation engine compiled by mypyc (decision 0109;
# needs a C compiler and Python's headers; mypyc comes with the dev install's mypy).
wheel: $(VENV)/.installed-dev
	$(PY) -m pip wheel -q --no-deps -w dist .

wheel-compiled: $(VENV)/.installed-dev
	$(PY) scripts/compiled_wheel.py --dist dist

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist src/*.egg-info
