# Shared settings for the setup scripts. Everything heavy lives outside the repo, under
# FLAGSEARCH_HOME, so a fresh clone on the same machine (CI) reuses engines, models and builds.
set -euo pipefail
FLAGSEARCH_HOME="${FLAGSEARCH_HOME:-$HOME/.cache/flagsearch}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
mkdir -p "$FLAGSEARCH_HOME"
log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
