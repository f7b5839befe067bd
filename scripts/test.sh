#!/usr/bin/env bash
# Runs the whole test suite: starts the local services the tests need, runs pytest, stops them.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
status=0
.venv/bin/python -m pytest -v --durations=25 "$@" || status=$?
echo "test suite finished in $(( $(date +%s) - start )) s (exit $status)"
exit $status
