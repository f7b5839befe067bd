#!/usr/bin/env bash
# The whole test suite on real engines: installs and starts the local services the tests need
# (a private dockerd, a private PostgreSQL, headless Chromium), runs pytest, stops the services.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
start=$(date +%s)

bash scripts/setup_chromium.sh
bash scripts/postgres.sh start
bash scripts/dockerd.sh start
export DOCKER_HOST="unix://$FLAGSEARCH_HOME/docker/docker.sock"
export FLAGSEARCH_PG_URL="$(bash scripts/postgres.sh url)"
cleanup() {
  bash scripts/dockerd.sh stop || true
  bash scripts/postgres.sh stop || true
}
trap cleanup EXIT
log "services up in $(( $(date +%s) - start )) s"

status=0
.venv/bin/python -m pytest -v -p no:cacheprovider --durations=30 "$@" || status=$?
log "test suite finished in $(( $(date +%s) - start )) s (pytest exit $status)"
exit $status
