#!/usr/bin/env bash
# A private PostgreSQL server for distributed-study tests: start | stop | url.
# Uses Debian's postgresql package (installed if missing); data under /var/tmp (the server runs
# as the `postgres` system user, which cannot enter /root), listening on 127.0.0.1 only.
# Runs as root, or as a user with passwordless sudo (GitHub-hosted runners): only apt-get goes
# through sudo; a non-root user runs the server as itself.
source "$(dirname "$0")/common.sh"
close_inherited_fds
PORT="${FLAGSEARCH_PG_PORT:-55432}"
PGDIR="${FLAGSEARCH_PG_DIR:-/var/tmp/flagsearch-postgres-$PORT}"
DATA="$PGDIR/data"
LOGFILE="$PGDIR/server.log"
URL="postgresql+psycopg2://postgres@127.0.0.1:$PORT/flagsearch"

bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$d" ]; then
    log "installing Debian's postgresql package"
    "${SUDO[@]}" apt-get update -qq >/dev/null \
      && "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    d=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  echo "$d"
}

if [ "$(id -u)" = 0 ]; then SUDO=(); else SUDO=(sudo -n); fi

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

case "${1:-}" in
  start)
    BIN=$(bindir)
    mkdir -p "$PGDIR"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$PGDIR"; fi
    if [ ! -f "$DATA/PG_VERSION" ]; then
      as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust >/dev/null
    fi
    if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
      as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOGFILE" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PORT -k /tmp -c max_connections=200" start >/dev/null
    fi
    as_pg "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname='flagsearch'" | grep -q 1 \
      || as_pg "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres flagsearch
    log "PostgreSQL ready: $URL"
    ;;
  stop)
    BIN=$(bindir)
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast stop >/dev/null 2>&1 || true
    ;;
  restart)
    BIN=$(bindir)
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w restart -l "$LOGFILE" \
      -o "-c listen_addresses=127.0.0.1 -p $PORT -k /tmp -c max_connections=200" >/dev/null
    ;;
  url)
    echo "$URL"
    ;;
  *)
    echo "usage: $0 start|stop|restart|url" >&2; exit 2
    ;;
esac
