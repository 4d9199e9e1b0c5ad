# batchstream: install, run and test everything locally, without Docker.
#
#   make up      create the environments, prepare the model, start the whole stack (detached)
#   make down    stop every process the stack started (by PID)
#   make test    lint, type-check and run the test suite
#
# Two environments, because vLLM and faust-streaming cannot share one:
#   .venv            api, aggregator, dev tools, stand-in servers  (requirements/main.lock)
#   .venv-inference  the vLLM worker                               (requirements/inference.lock)
# Each is installed from its lock with --no-deps, so nothing unpinned is ever resolved; a changed
# lock rebuilds its environment from scratch.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-builtin-rules

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
VENV_INF := .venv-inference
PY := $(VENV)/bin/python
PY_INF := $(VENV_INF)/bin/python
MODELS := .cache/models
MARKER := .batchstream-complete

# What `make up` serves; e.g. `make up UP_MODEL=tiny UP_MODEL_NAME=tiny-llama`.
UP_MODEL ?= gemma
UP_MODEL_DIR ?= $(MODELS)/$(if $(filter gemma,$(UP_MODEL)),gemma-3-270m,$(if $(filter tiny,$(UP_MODEL)),tiny-llama,$(UP_MODEL)))
UP_MODEL_NAME ?= $(notdir $(UP_MODEL_DIR))
TINY_DIR := $(MODELS)/tiny-llama

# pip's local find-links/extra-index config prints one harmless warning per package; hide those.
PIP_FILTER := { grep -v 'is ignored: it is neither a file nor a directory' || true; }

.PHONY: help venvs up down status test test-load lint format bench clean distclean

help:
	@echo "make up | down | status | test | test-load | lint | format | bench | clean | distclean"

# ------------------------------------------------------------------------------- environments

$(VENV)/.lock-installed: requirements/main.lock
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --no-deps -r requirements/main.lock 2>&1 | $(PIP_FILTER)
	touch $@

$(VENV)/.editable-installed: $(VENV)/.lock-installed pyproject.toml
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e . 2>&1 | $(PIP_FILTER)
	touch $@

$(VENV_INF)/.lock-installed: requirements/inference.lock
	rm -rf $(VENV_INF)
	$(PYTHON) -m venv $(VENV_INF)
	$(VENV_INF)/bin/pip install -q --no-deps -r requirements/inference.lock 2>&1 | $(PIP_FILTER)
	@# torchvision breaks `import vllm`; the others are unused on CPU (never in the lock: a guard)
	$(VENV_INF)/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>&1 \
		| { grep -v 'not installed' || true; }
	touch $@

$(VENV_INF)/.editable-installed: $(VENV_INF)/.lock-installed pyproject.toml
	$(VENV_INF)/bin/pip install -q --no-deps --no-build-isolation -e . 2>&1 | $(PIP_FILTER)
	touch $@

venvs: $(VENV)/.editable-installed $(VENV_INF)/.editable-installed

# ------------------------------------------------------------------------------------- models

$(MODELS)/gemma-3-270m/$(MARKER): | $(VENV_INF)/.editable-installed
	$(PY_INF) -m deploy.local.models gemma --out $(MODELS)/gemma-3-270m

$(MODELS)/tiny-llama/$(MARKER): | $(VENV_INF)/.editable-installed
	$(PY_INF) -m deploy.local.models tiny --out $(MODELS)/tiny-llama

$(MODELS)/minilm/$(MARKER): | $(VENV_INF)/.editable-installed
	$(PY_INF) -m deploy.local.models embed --out $(MODELS)/minilm

# ------------------------------------------------------------------------------------- stack

up: venvs $(UP_MODEL_DIR)/$(MARKER)
	$(PY) -m deploy.local.stack up --model $(UP_MODEL_DIR)=$(UP_MODEL_NAME) \
		--inference-python $(PY_INF)

down:
	@if [ -x $(PY) ]; then $(PY) -m deploy.local.stack down; else echo "no $(VENV): nothing to stop"; fi

status:
	@$(PY) -m deploy.local.stack status

# -------------------------------------------------------------------------------------- checks

lint: $(VENV)/.editable-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy shared services

format: $(VENV)/.editable-installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: venvs $(TINY_DIR)/$(MARKER) lint
	BATCHSTREAM_TEST_INFERENCE_PYTHON=$(CURDIR)/$(PY_INF) \
	BATCHSTREAM_TEST_MODEL_DIR=$(CURDIR)/$(TINY_DIR) \
		$(PY) -m pytest -q -m "not load"

# The load test (~100 s: twenty clients during a 20,000-line batch; prints GET latency p50/p99).
test-load: venvs
	$(PY) -m pytest -q -s -m load tests/integration/test_load.py

# Runs `python -m bench` (bench/__main__.py) on the tiny model; e.g. `make bench BENCH_ARGS="--only parity"`.
BENCH_ARGS ?=
bench: venvs $(TINY_DIR)/$(MARKER)
	@if [ ! -f bench/__main__.py ]; then echo "no bench/ yet"; exit 0; fi; \
	BATCHSTREAM_BENCH_INFERENCE_PYTHON=$(CURDIR)/$(PY_INF) \
	BATCHSTREAM_BENCH_MODEL_DIR=$${BATCHSTREAM_BENCH_MODEL_DIR:-$(CURDIR)/$(TINY_DIR)} \
		$(PY) -m bench $(BENCH_ARGS)

# -------------------------------------------------------------------------------------- clean

# Stops the stack and removes its data and caches; keeps the environments and prepared models.
clean: down
	rm -rf .state .mypy_cache .ruff_cache .pytest_cache build *.egg-info
	find . -path ./$(VENV) -prune -o -path ./$(VENV_INF) -prune -o \
		-name __pycache__ -type d -exec rm -rf {} +

# Also removes both environments and the prepared models.
distclean: clean
	rm -rf $(VENV) $(VENV_INF) .cache
