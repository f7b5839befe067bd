#!/usr/bin/env bash
# A private Docker engine for flagsearch's tests and Docker launches, under FLAGSEARCH_HOME/docker.
#   scripts/dockerd.sh start    install docker.io if dockerd is missing, start dockerd (idempotent),
#                               build the local test image, write FLAGSEARCH_HOME/docker/env
#   scripts/dockerd.sh stop     stop the dockerd this script started (by its pidfile), nothing else
#   scripts/dockerd.sh status   print DOCKER_HOST and whether the engine answers
#   scripts/dockerd.sh image    (re)build the test image only
# Then: `source "$FLAGSEARCH_HOME/docker/env"` (or export DOCKER_HOST=unix://$FLAGSEARCH_HOME/docker/docker.sock).
# Host networking only (no bridge, no iptables); no registry is reachable, so the test image is made
# locally: a static busybox rootfs `docker import`ed, run with the host's /usr bind-mounted read-only.
# Runs as root, or as a user with passwordless sudo (GitHub-hosted runners): dockerd and apt-get go
# through sudo, and the socket belongs to the user's group so that the user's tests can reach it.
source "$(dirname "$0")/common.sh"
close_inherited_fds
DIR="$FLAGSEARCH_HOME/docker"
SOCK="$DIR/docker.sock"
PIDFILE="$DIR/dockerd.pid"
export DOCKER_HOST="unix://$SOCK"
IMAGE="${FLAGSEARCH_TEST_IMAGE:-flagsearch/busybox-host:1}"

if [ "$(id -u)" = 0 ]; then SUDO=(); else SUDO=(sudo -n); fi
need_root() {
  [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null \
    || { log "dockerd needs root or passwordless sudo (run as root, or allow this user sudo)"; exit 1; }
}

install_packages() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  # ldd exits 1 on a static binary: read its words, not its status (pipefail made this always fail).
  [ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 \
    && [[ "$(ldd /bin/busybox 2>&1 || true)" == *"not a dynamic"* ]] || missing+=(busybox-static)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]} (apt-get)"
    "${SUDO[@]}" apt-get update -qq >/dev/null
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
      >/dev/null
  fi
}

# /proc, not kill -0: a user cannot signal the root dockerd it started through sudo.
running() { [ -f "$PIDFILE" ] && [ -d "/proc/$(cat "$PIDFILE")" ]; }

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start() {
  need_root
  install_packages
  mkdir -p "$DIR/data" "$DIR/exec"
  if running && answers; then
    log "dockerd already running (pid $(cat "$PIDFILE")), DOCKER_HOST=$DOCKER_HOST"
  else
    rm -f "$SOCK"
    log "starting dockerd, DOCKER_HOST=$DOCKER_HOST"
    # setsid: its own session, so that a Ctrl-C in the caller's terminal does not reach it.
    # --group: the socket's group, so that a non-root user who started it through sudo can use it.
    # Own containerd namespaces: a host that already runs Docker (a CI runner) shares its containerd.
    setsid "${SUDO[@]}" dockerd --host "$DOCKER_HOST" --data-root "$DIR/data" --exec-root "$DIR/exec" \
      --pidfile "$PIDFILE" --group "$(id -gn)" --iptables=false --ip6tables=false --bridge=none \
      --containerd-namespace flagsearch --containerd-plugins-namespace flagsearch-plugins \
      --storage-driver=overlay2 >"$DIR/dockerd.log" 2>&1 < /dev/null &
    for _ in $(seq 1 60); do answers && break; sleep 0.5; done
    answers || { log "dockerd did not answer within 30 s; see $DIR/dockerd.log"; tail -5 "$DIR/dockerd.log" >&2; exit 1; }
    log "dockerd ready (server $(docker version --format '{{.Server.Version}}'))"
  fi
  printf 'export DOCKER_HOST=%q\nexport FLAGSEARCH_TEST_IMAGE=%q\n' "$DOCKER_HOST" "$IMAGE" > "$DIR/env"
  build_image
}

build_image() {
  if docker image inspect "$IMAGE" >/dev/null 2>&1; then log "test image ready: $IMAGE"; return; fi
  local root; root=$(mktemp -d)
  mkdir -p "$root"/{bin,dev,etc,proc,sys,tmp,models,cache,usr}
  cp /bin/busybox "$root/bin/busybox"
  for tool in sh ls cat sleep ps kill echo env; do ln -s busybox "$root/bin/$tool"; done
  # The host's /usr is bind-mounted read-only at run time; these links make its libraries resolve.
  ln -s usr/lib "$root/lib"; ln -s usr/lib64 "$root/lib64"
  echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
  echo "nobody:x:65534:65534:nobody:/:/bin/sh" >> "$root/etc/passwd"
  tar -C "$root" -cf "$root.tar" .
  docker import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' "$root.tar" "$IMAGE" >/dev/null
  rm -rf "$root" "$root.tar"
  log "test image built: $IMAGE"
}

stop() {
  if running; then
    local pid; pid=$(cat "$PIDFILE")
    # Our containers first (label flagsearch=1), then the daemon we started; nothing else.
    ids=$(docker ps -aq --filter label=flagsearch=1 2>/dev/null || true)
    [ -n "$ids" ] && docker rm -f $ids >/dev/null 2>&1 || true
    "${SUDO[@]}" kill "$pid"
    for _ in $(seq 1 40); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
    [ -d "/proc/$pid" ] && { log "dockerd (pid $pid) did not stop; killing it"; "${SUDO[@]}" kill -9 "$pid"; }
    log "dockerd stopped"
  else
    log "dockerd is not running"
  fi
}

status() {
  echo "DOCKER_HOST=$DOCKER_HOST"
  if running && answers; then echo "running (pid $(cat "$PIDFILE"))"; else echo "not running"; exit 1; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  image) build_image ;;
  *) echo "usage: $0 start|stop|status|image" >&2; exit 2 ;;
esac
