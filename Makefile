# rocketstore — run `make help` for the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= data/demo
DEMO_SECONDS ?= 60

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-12s %s\n", $$1, $$2}'

NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)
# The editable install is a tree of links (build/__editable__.*) to the files of these folders,
# which mypy and PySpark's data source lookup can follow: a file added or removed (a folder's
# time changes) installs it again.
PACKAGE_DIRS := pipeline pipeline/format pipeline/files pipeline/engine pipeline/tier pipeline/tools pipeline/tools/verify pipeline/console sink source datasource datasource/pyspark_rocketstore jobs

# The install compiles the native core: say so before pip does, when cargo is missing.
$(STAMP): pyproject.toml $(NATIVE_SOURCES) $(PACKAGE_DIRS)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "rocketstore needs Python >= 3.11, found " + sys.version.split()[0])'
	@command -v cargo >/dev/null 2>&1 || { \
		echo "rocketstore's native core is a Rust crate and there is no 'cargo' on PATH."; \
		echo "Install a Rust toolchain (1.85 or later), e.g. 'curl https://sh.rustup.rs | sh'"; \
		echo "or 'sudo apt install cargo' where the distribution's is recent enough."; \
		exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' --config-settings editable_mode=strict
	@# A name for the tree of links that does not carry the version and Python tags: mypy's path.
	@ln -sfn "$$(cd build && ls -d __editable__.rocketstore-* | head -1)" build/editable
	@touch $(STAMP)

venv: $(STAMP) ## Create .venv and install rocketstore with its dev tools

# Two workers: much of the suite waits on JVMs, subprocesses and mounts rather than computing.
# Tests that share a machine-wide resource stay in one worker (see tests/conftest.py).
PYTEST_WORKERS ?= 2

test: $(STAMP) ## Run the whole test suite (the crate's unit tests, then pytest)
	cd native && cargo test --release --quiet
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=30

# tests/test_spark_versions.py again under each older PySpark (docs/spark-versions.md), each in
# its own virtualenv under build/spark-matrix/ (pip's cache keeps the wheels it builds).
spark-matrix: java $(STAMP) ## Run the Spark version tests under PySpark 3.5, 4.0, 4.1 and 4.2
	$(PY) -m tests.kit.sparkmatrix

# The inner loop: the tests that start no process, no Spark and no server (tests/conftest.py
# marks the others `heavy`). `make test` and .ci/run still run everything.
check: lint ## Quick tier: lint, the crate's tests, the unit and property tests (no Spark, no servers)
	cd native && cargo test --release --quiet
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) -m "not heavy" --durations=10

demo: java $(STAMP) ## Run the whole Spark pipeline for a minute, then print what it did
	$(PY) -m rocketstore.jobs.demo --dir $(DEMO_DIR) --seconds $(DEMO_SECONDS)

# Spark 4 runs on Java 17 or later; say so before spending time on the venv.
java:
	@if ! command -v java >/dev/null 2>&1; then \
		echo "rocketstore's Spark jobs need Java 17 (or later) and there is no 'java' on PATH."; \
		echo "Install it, e.g. 'sudo apt install openjdk-17-jre-headless' (Debian/Ubuntu),"; \
		echo "'sudo dnf install java-17-openjdk-headless' (Fedora) or 'brew install openjdk@17' (macOS)."; \
		exit 1; \
	fi; \
	major=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	if [ -n "$$major" ] && [ "$$major" -lt 17 ]; then \
		echo "rocketstore's Spark jobs need Java 17 or later; 'java' on PATH is version $$major."; \
		echo "Install it, e.g. 'sudo apt install openjdk-17-jre-headless', and put it first on PATH."; \
		exit 1; \
	fi

# One abi3 wheel (every CPython from 3.11 on, this platform) and the sdist, into dist/.
wheel: $(STAMP) ## Build the wheel and the sdist into dist/
	rm -rf dist
	$(PY) -m pip wheel --no-deps --quiet -w dist .
	$(PY) -m build --sdist --outdir dist .
	@ls -1 dist

bench: $(STAMP) ## Run the benchmarks in bench/ (figures in bench/README.md)
	$(PY) -m bench

# From the newest results of each part in bench/out/ (python -m bench.charts --results DIR for
# another folder); a chart whose part has no results there says which part to run.
charts: $(STAMP) ## Redraw docs/images/*.svg from the newest bench results in bench/out/
	$(PY) -m bench.charts

# A 4-minute live run under a real Prometheus (docs/monitoring.md); needs Debian's prometheus.
dashboard: $(STAMP) ## Draw docs/images/dashboard.png from a live run scraped by Prometheus
	$(PY) -m bench.dashboard

lint: $(STAMP) ## ruff (lint and format check), mypy, the import layers, cargo fmt --check and clippy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	cd native && cargo fmt --check && cargo clippy --all-targets -- -D warnings

format: $(STAMP) ## Format the code with ruff and cargo fmt
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
	cd native && cargo fmt

# Only what the demo made goes: the names its marker file lists, inside DEMO_DIR. A store of
# your own (the data/store of the docs' examples, say) is never touched.
clean: ## Remove what `make demo` made, bench output and caches (keeps .venv and your data)
	@marker='$(DEMO_DIR)/.rocketstore-demo'; \
	if [ -f "$$marker" ]; then \
		while IFS= read -r name; do \
			case "$$name" in ''|'#'*|*/*|.|..) ;; *) rm -rf -- '$(DEMO_DIR)'/"$$name" ;; esac; \
		done < "$$marker"; \
		rm -f -- "$$marker"; \
		rmdir -- '$(DEMO_DIR)' 2>/dev/null || true; \
		echo "removed the demo's files in $(DEMO_DIR)"; \
	fi
	rm -rf .pytest_cache .mypy_cache .ruff_cache bench/out dist

.PHONY: help venv test spark-matrix check demo java wheel bench charts dashboard lint format clean
