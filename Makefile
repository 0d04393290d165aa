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

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## create .venv with kvpool and its test tools

.PHONY: system-deps
system-deps: ## apt-install prometheus and redis-server when missing (needs root)
	@if ! command -v prometheus >/dev/null || ! command -v redis-server >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends prometheus redis-server >/dev/null; \
	fi
	@prometheus --version 2>&1 | head -1; redis-server --version

.PHONY: engine
engine: ## install the vLLM CPU engine into .cache/vllm-venv (cached)
	bash scripts/ensure-vllm.sh

.PHONY: deps
deps: venv system-deps engine ## everything the tests need

.PHONY: demo
demo: venv ## the main job: validate the examples and print their admission plan
	$(BIN)/kvpool validate -f examples/
	$(BIN)/kvpool plan -f examples/ --kv-tokens-per-replica 200000

.PHONY: crds
crds: venv ## regenerate crds/*.yaml (and the chart's copy) from the pydantic models
	$(BIN)/kvpool crds --out-dir crds/
	cp crds/*.yaml charts/kvpool/crds/

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
	$(BIN)/pytest tests $(PYTEST_ARGS)

.PHONY: bench
bench: deps ## run the benchmarks (writes bench/results/)
	for b in bench/*.py; do $(PY) $$b || exit 1; done

.PHONY: clean
clean: ## remove caches (keeps the vLLM venv)
	rm -rf .mypy_cache .ruff_cache .pytest_cache .hypothesis
