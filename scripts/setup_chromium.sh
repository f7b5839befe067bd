#!/usr/bin/env bash
# Installs Debian's chromium for the report render test (tests/search/test_report_render.py), once.
# Headless only: the test runs it with --headless --no-sandbox and no network.
source "$(dirname "$0")/common.sh"
for bin in chromium chromium-browser; do
  if command -v "$bin" >/dev/null 2>&1; then log "chromium ready: $(command -v "$bin")"; exit 0; fi
done
# Root, or a user with passwordless sudo (GitHub-hosted runners).
if [ "$(id -u)" = 0 ]; then SUDO=(); else SUDO=(sudo -n); fi
if [ "$(id -u)" -ne 0 ] && ! sudo -n true 2>/dev/null; then
  log "chromium is missing and installing it needs root: apt-get install -y --no-install-recommends chromium"
  exit 1
fi
start=$(date +%s)
log "installing chromium from Debian (apt-get, about 1-2 minutes)"
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
  fonts-dejavu-core >/dev/null
log "chromium installed in $(( $(date +%s) - start )) s: $(command -v chromium)"
