# Shared settings for the setup scripts. Everything heavy lives outside the repo, under
# FLAGSEARCH_HOME, so a fresh clone on the same machine (CI) reuses engines, models and builds.
set -euo pipefail
FLAGSEARCH_HOME="${FLAGSEARCH_HOME:-$HOME/.cache/flagsearch}"
# The engines' venvs use the same Python rule as the Makefile: 3.11 or 3.12, found, not assumed.
if [ -z "${PYTHON:-}" ]; then
  for p in python3.11 python3.12 python3; do
    if "$p" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 11), (3, 12)))' >/dev/null 2>&1; then
      PYTHON="$p"; break
    fi
  done
fi
PYTHON="${PYTHON:-python3}"
mkdir -p "$FLAGSEARCH_HOME"
log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Daemons these scripts start (PostgreSQL, dockerd) must not inherit the caller's open files: a
# lock held by `flock LOCK make test` would otherwise live on in the daemon and block every later
# holder. Close every descriptor past stderr (bash reads the script itself from 255: kept).
close_inherited_fds() {
  local fd
  for fd in /proc/$$/fd/*; do
    fd=${fd##*/}
    if [ "$fd" -gt 2 ] && [ "$fd" -lt 255 ]; then eval "exec $fd>&-"; fi
  done
}
