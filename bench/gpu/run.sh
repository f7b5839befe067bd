#!/usr/bin/env bash
# Device-side driver of the GPU validation (run through the `device` tool from the repo root,
# carrying .gpu/llama-src.tgz and .whl/): installs the carried wheels, builds llama-server with
# CUDA, writes a random 1.1B f16 GGUF meanwhile, measures copy bandwidth, runs a real
# `search run` over bench/gpu/llamacpp-h100.yaml in the time left, and writes the table to $OUT.
# MODE=interleave: instead, re-measures a few configs interleaved (bench/gpu/interleave.py).
set -uo pipefail
export PYTHONUNBUFFERED=1 FSGPU="${FSGPU:-/tmp/fsgpu}"
OUT="${OUT:-/tmp/fsgpu-out}"
BUDGET_S="${BUDGET_S:-560}"   # the whole command must end inside the device tool's 600 s
T0=$(date +%s)
mkdir -p "$FSGPU" "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv,noheader
nvcc --version | tail -2
MODEL="$FSGPU/random-1b-f16.gguf"
GGUF_PID=""
if [ ! -f "$MODEL" ]; then
  python3 bench/gpu/make_random_gguf.py "$MODEL.tmp" > "$FSGPU/gguf.log" 2>&1 && mv "$MODEL.tmp" "$MODEL" &
  GGUF_PID=$!
fi
bash bench/gpu/build_llama_cuda.sh .gpu/llama-src.tgz "$FSGPU" || exit 1
[ -n "$GGUF_PID" ] && { wait "$GGUF_PID"; cat "$FSGPU/gguf.log"; }
[ -f "$MODEL" ] || { echo "no model"; exit 1; }
echo "setup done at $(( $(date +%s) - T0 )) s"
python3 bench/gpu/summarize.py bandwidth > "$FSGPU/bandwidth.json"; cat "$FSGPU/bandwidth.json"
if [ "${MODE:-search}" = interleave ]; then
  timeout $(( BUDGET_S - ($(date +%s) - T0) )) python3 bench/gpu/interleave.py --rounds "${ROUNDS:-3}" \
    --out "$OUT/interleave.md" 2>&1 | tail -30
  echo "total $(( $(date +%s) - T0 )) s"; exit 0
fi
LEFT=$(( BUDGET_S - ($(date +%s) - T0) - 45 ))
echo "search: $LEFT s left"
if [ "$LEFT" -gt 60 ]; then
  timeout --signal=TERM "$LEFT" python3 -m search.cli run bench/gpu/llamacpp-h100.yaml --trials "${TRIALS:-12}" \
    --results "$FSGPU/results" --study llamacpp-h100 --timeout $(( LEFT - 50 )) 2>&1 | tee "$OUT/search.log" | tail -60
fi
python3 bench/gpu/summarize.py table "$FSGPU/results" --model "$MODEL" --bandwidth "$FSGPU/bandwidth.json" \
  --out "$OUT" | tee "$OUT/table.md"
echo "total $(( $(date +%s) - T0 )) s"
