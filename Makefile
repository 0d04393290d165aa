# kvpool developer tasks. `make help` lists them.
# Everything installs itself on a fresh Debian 12 machine (as root for apt packages).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
KVPOOL_VLLM_VENV ?= .cache/vllm-venv
export KVPOOL_VLLM_VENV
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

# One version (operator/kvpool/__init__.py): the package's, the image tag, the chart's
# appVersion; the chart's version is its SemVer spelling (0.1.0.dev0 -> 0.1.0-dev.0).
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' operator/kvpool/__init__.py)
DOCKER ?= docker
IMAGE ?= ghcr.io/kvpool/kvpool
IMAGE_TAG ?= $(VERSION)
ENGINE_IMAGE ?= kvpool-tiny-engine:e2e
CHART_REGISTRY ?= oci://ghcr.io/kvpool/charts
DIST ?= dist

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## create .venv with kvpool and its test tools

.PHONY: system-deps
system-deps: ## apt-install prometheus, redis-server and shellcheck when missing (needs root)
	@if ! command -v prometheus >/dev/null || ! command -v redis-server >/dev/null \
	    || ! command -v shellcheck >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends prometheus redis-server shellcheck >/dev/null; \
	fi
	@prometheus --version 2>&1 | head -1; redis-server --version

.PHONY: engine
engine: ## install the vLLM CPU engine into .cache/vllm-venv (cached)
	bash scripts/ensure-vllm.sh

.PHONY: deps
deps: venv system-deps engine ## everything the tests need

.PHONY: demo
demo: deps ## the main job: the local end-to-end demo (operator, gateway, real engine, traffic)
	$(PY) -m e2e.local_demo $(DEMO_ARGS)

.PHONY: plan
plan: venv ## validate examples/ and print their admission plan (no engines needed)
	$(BIN)/kvpool validate -f examples/
	$(BIN)/kvpool plan -f examples/ --kv-tokens-per-replica 200000

.PHONY: crds
crds: venv ## regenerate crds/*.yaml (and the chart's copy) from the pydantic models
	$(BIN)/kvpool crds --out-dir crds/
	cp crds/*.yaml charts/kvpool/crds/

.PHONY: image
image: ## build the operator/gateway image $(IMAGE):$(IMAGE_TAG) from the Dockerfile (needs Docker)
	$(DOCKER) build -t $(IMAGE):$(IMAGE_TAG) -f Dockerfile .

.PHONY: engine-image
engine-image: ## build the kind e2e's vLLM CPU engine image with the tiny model baked in (needs Docker)
	@ctx="$$(mktemp -d)" && mkdir -p "$$ctx/tests/support" "$$ctx/scripts" \
	  && cp tests/support/tiny_model.py tests/support/make_tiny_model.py "$$ctx/tests/support/" \
	  && cp scripts/kvpool_amx_permission.py "$$ctx/scripts/" \
	  && $(DOCKER) build -t $(ENGINE_IMAGE) -f e2e/kind/engine.Dockerfile "$$ctx"; \
	  status=$$?; rm -rf "$$ctx"; exit $$status

.PHONY: chart
chart: venv ## package charts/kvpool as $(DIST)/kvpool-<version>.tgz (helm package; versions from kvpool.__version__)
	$(PY) scripts/package_chart.py --out-dir $(DIST)

.PHONY: chart-push
chart-push: chart ## push the packaged chart to $(CHART_REGISTRY) (helm push; log in with helm registry login first)
	helm push $(DIST)/kvpool-$$($(PY) scripts/package_chart.py --print-version).tgz $(CHART_REGISTRY)

.PHONY: plugin
plugin: ## the krew archive of the kubectl plugin and plugins/kvpool.yaml's sha256 (dist/)
	$(PY) scripts/krew_plugin.py --out-dir $(DIST)

.PHONY: lint
lint: venv ## ruff (lint + format check), mypy, import-linter
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy
	$(BIN)/lint-imports

.PHONY: unit
unit: venv ## unit tests only (fast, no real engines)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

.PHONY: test
test: deps lint ## the whole suite: lint, types, import contracts, unit and integration tests
	$(BIN)/pytest tests e2e $(PYTEST_ARGS)

.PHONY: bench
bench: deps ## run every benchmark (writes bench/results/; ~20 min)
	for b in bench/*.py; do $(PY) $$b || exit 1; done

.PHONY: bench-protection
bench-protection: deps ## interactive TTFT under a batch flood: alone, FCFS, engine priority, kvpool
	$(PY) bench/protection.py $(if $(QUICK),--quick)

.PHONY: bench-peers
bench-peers: deps ## issue 19: kvpool vs FCFS, priority-only and vllm-router (2 pinned engines), planner-made configs (QUICK=1, MIX=long-prompt)
	scripts/ensure-vllm-router.sh >/dev/null
	$(PY) bench/peers.py $(if $(QUICK),--quick) $(if $(MIX),--mix $(MIX))

.PHONY: bench-gateway
bench-gateway: deps ## gateway added latency at 100 streams and decisions/s
	$(PY) bench/gateway_overhead.py $(if $(QUICK),--quick)

.PHONY: bench-admission
bench-admission: venv ## admission decisions/s on one core vs a naive FIFO admitter
	$(PY) bench/admission_decisions.py

.PHONY: bench-operator
bench-operator: venv ## 1,000 pools x 4 tiers and 5,000 tenants against the API emulator
	$(PY) bench/operator_scale.py $(if $(QUICK),--quick)

.PHONY: e2e-kind
e2e-kind: ## kind-based e2e on a real cluster (needs docker, kind and helm; not run by CI here)
	bash e2e/kind/run.sh

.PHONY: clean
clean: ## remove caches (keeps the vLLM venv)
	rm -rf .mypy_cache .ruff_cache .pytest_cache .hypothesis
