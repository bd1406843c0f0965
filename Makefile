# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv venv-sglang test test-unit test-lab demo demo-down clean

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

# A second venv for the SGLang plugin's contract tests (tests/ddtree_engine/sglang_plugin): the
# real sglang wheel of the pinned release (ddtree_engine.sglang_plugin.SUPPORTED_SGLANG_VERSION),
# installed without its dependencies (CUDA kernels, torch 2.14.1), next to the CPU torch, plus the
# light packages that `import sglang.srt.server_args` and the tests need, pinned (sglang's own pin
# where it has one; fastapi, uvicorn, pydantic and triton come with the engine). Not the main venv:
# sglang --no-deps leaves requirements that `pip check` reports, and the main venv's own
# manifest test runs `pip check` on it.
SGLANG_VERSION := 0.5.23
SGLANG_LIGHT_DEPS := orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 pyzmq==27.3.0 msgspec==0.23.0 \
	uvloop==0.23.0 apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 setproctitle==1.3.8 einops==0.8.2 \
	compressed-tensors==0.18.0 gguf==0.19.0 openai==2.8.0 partial-json-parser==0.2.1.1.post7 \
	jsonschema==4.26.0 xgrammar==0.2.7 soundfile==0.13.1 python-multipart==0.0.34 \
	IPython==9.18.1 aiohttp==3.14.5 dill==0.4.1 pillow==13.0.0
SG_VENV := .venv-sglang
SG_STAMP := $(SG_VENV)/.installed

$(SG_STAMP): engine_patches/ddtree_engine/pyproject.toml Makefile
	$(PYTHON) -m venv $(SG_VENV)
	$(SG_VENV)/bin/pip install -q --upgrade pip
	$(SG_VENV)/bin/pip install -q torch==2.13.0
	$(SG_VENV)/bin/pip install -q -e 'engine_patches/ddtree_engine[dev]'
	$(SG_VENV)/bin/pip install -q --no-deps sglang==$(SGLANG_VERSION)
	$(SG_VENV)/bin/pip install -q $(SGLANG_LIGHT_DEPS)
	touch $(SG_STAMP)

venv-sglang: $(SG_STAMP)

venv: $(STAMP)

test: venv venv-sglang
	# The ops tests that check rendered SGLang argv and the plugin manifest use the sglang venv's Python.
	# --durations: the 30 slowest tests in the log, where CI's time goes (~60 min on a 2-core machine).
	DDTREE_SGLANG_PYTHON=$(CURDIR)/$(SG_VENV)/bin/python $(BIN)/pytest -q --durations=30
	# DDTREE_REQUIRE_SGLANG: a venv without sglang fails these tests instead of skipping them.
	DDTREE_REQUIRE_SGLANG=1 $(SG_VENV)/bin/pytest -q tests/ddtree_engine/sglang_plugin

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
	rm -rf $(VENV) $(SG_VENV) build dist
