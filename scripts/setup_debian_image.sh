#!/usr/bin/env bash
# A Debian base image with Python made on this machine, for the engine images built over it: no
# image registry is needed (none is reachable on these machines), only Debian's package mirror.
#   scripts/setup_debian_image.sh           prints the image's tag once it exists (built if absent)
# The tag names the recipe (a hash of the suite, the packages and the steps below), so a changed
# recipe is a new image and an unchanged one is never rebuilt. debootstrap (minbase) installs python3 with venv, and the libraries
# CPU inference engines load (libgomp, libnuma); /opt/venv holds an empty venv with pip, where engines
# are installed (harness/builds/overlay.py); git is there for pip installs from a repository.
# Needs root (debootstrap, chroot) and a Docker engine (DOCKER_HOST; scripts/dockerd.sh start).
source "$(dirname "$0")/common.sh"
SUITE="${FLAGSEARCH_DEBIAN_SUITE:-bookworm}"
PACKAGES=python3,python3-venv,libgomp1,libnuma1,ca-certificates,git,procps
RECIPE=$(printf '%s\n' "$SUITE" "$PACKAGES" "minbase" "venv /opt/venv" "PATH /opt/venv/bin first" | sha256sum | cut -c1-12)
TAG="flagsearch/debian-python:$SUITE-$RECIPE"
ALIAS="flagsearch/debian-python:$SUITE"  # the current recipe's image, for the tests and for users
if docker image inspect "$TAG" >/dev/null 2>&1; then docker tag "$TAG" "$ALIAS"; echo "$TAG"; exit 0; fi
[ "$(id -u)" = 0 ] || { log "building $TAG needs root (debootstrap and chroot)"; exit 1; }
command -v debootstrap >/dev/null 2>&1 || {
  log "installing debootstrap (apt-get)"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}
start=$(date +%s)
root=$(mktemp -d "${TMPDIR:-/tmp}/flagsearch-rootfs.XXXXXX")
# debootstrap mounts /proc and /sys inside the target while it runs: an interrupted run leaves them
# mounted, and removing the folder would then walk into the host's /proc. Unmount first, always.
cleanup() {
  local m
  for m in $(awk -v r="$root" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r); do umount -l "$m" || true; done
  if awk -v r="$root" 'index($2, r) == 1 {found=1} END {exit !found}' /proc/mounts; then
    log "not removing $root: something is still mounted under it"; return
  fi
  rm -rf "$root" "$root.tar" "$root.log"
}
trap cleanup EXIT
log "debootstrap $SUITE (minbase) into $root: about 1-2 minutes"
# No mirror argument: debootstrap's own default mirror for Debian.
debootstrap --variant=minbase \
  --include="$PACKAGES" \
  "$SUITE" "$root" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
chroot "$root" /usr/bin/python3 -m venv /opt/venv
chroot "$root" /opt/venv/bin/python -m pip --version >/dev/null
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/*
tar -C "$root" --numeric-owner -cf "$root.tar" .
docker import \
  --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change "LABEL flagsearch.recipe=$RECIPE flagsearch.base=debian-$SUITE" \
  "$root.tar" "$TAG" >/dev/null
docker tag "$TAG" "$ALIAS"
log "base image $TAG built in $(( $(date +%s) - start )) s ($(docker image inspect "$TAG" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}'))"
echo "$TAG"
