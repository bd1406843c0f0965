# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test test-unit test-lab demo demo-down clean

# The demo's lab lives inside the checkout, so its project file has a known path.
LAB_DIR := $(CURDIR)/.lab
DEMO_OUT := $(CURDIR)/demo-out
OPS := DDTREE_LAB_DIR=$(LAB_DIR) DDTREE_CONFIG=$(LAB_DIR)/ddtree.yaml $(BIN)/ddtree-ops

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

# The main job on the embedded default: a local lab fleet of 2 hosts, provision, deploy
# --budget 15 --topk 8, healthcheck, compare (tables printed; reports in demo-out/).
demo: venv
	docker/lab/ensure-docker.sh
	$(OPS) lab up --hosts 2
	$(OPS) provision
	$(OPS) deploy --budget 15 --topk 8
	$(OPS) healthcheck
	$(OPS) compare --runs 2 --out $(DEMO_OUT)
	@echo "The lab is still up: DDTREE_CONFIG=$(LAB_DIR)/ddtree.yaml .venv/bin/ddtree-ops ... ; 'make demo-down' removes it."

demo-down: venv
	$(OPS) lab down

clean:
	rm -rf $(VENV) build dist
