# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test test-unit test-lab demo clean

$(STAMP): pyproject.toml engine_patches/ddtree_engine/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch first, so the engine's `torch>=` range takes it instead of a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e 'engine_patches/ddtree_engine[dev]' -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

test: venv
	$(BIN)/pytest -q

test-unit: venv
	$(BIN)/pytest -q -m "not lab and not slow"

test-lab: venv
	$(BIN)/pytest -q -m lab

clean:
	rm -rf $(VENV) build dist
