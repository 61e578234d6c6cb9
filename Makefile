# rocketstore — run `make help` for the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STORE ?= data/demo-store

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "rocketstore needs Python >= 3.11, found " + sys.version.split()[0])'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP) ## Create .venv and install rocketstore with its dev tools

test: $(STAMP) ## Run the whole test suite
	$(PY) -m pytest -q

demo: $(STAMP) ## Write a sample store with the CLI and show what it holds
	$(PY) -m jobs.sample_store --store $(DEMO_STORE)

bench: $(STAMP) ## Run the benchmarks in bench/ (figures in bench/README.md)
	$(PY) -m bench

lint: $(STAMP) ## ruff (lint and format check) and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP) ## Format the code with ruff
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean: ## Remove the demo store and caches (keeps .venv)
	rm -rf data .pytest_cache .mypy_cache .ruff_cache bench/out

.PHONY: help venv test demo bench lint format clean
