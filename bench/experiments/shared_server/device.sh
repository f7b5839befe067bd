#!/usr/bin/env bash
# The shared-server experiment (run.py) on a many-core CPU: the GPU machine's host CPU, no GPU used (not
# calm with 7 workers: docs/lab-notes/2026-12-02-shared-server.md). WORKERS independent repetitions at once,
# each with its servers pinned to one core and its client to another (no two share a core); the model is a
# random-weight f16 GGUF of SmolLM2-135M's shape (as bench/gpu/cpu_live.sh).
# Run through the `device` tool from the repo root with carry [".gpu", ".whl"] (scripts/prepare_gpu.sh):
#   WORKERS=7 PAIRS=12 bash bench/experiments/shared_server/device.sh
# Each worker writes $OUT/shared-server-<worker>.json and prints its table.
set -uo pipefail
export PYTHONUNBUFFERED=1 FSGPU="${FSGPU:-/tmp/fsgpu}"
OUT="${OUT:-/tmp/fsgpu-out}"
WORKERS="${WORKERS:-7}"
PAIRS="${PAIRS:-12}"
T0=$(date +%s)
source bench/gpu/cpu_host.sh || exit 1
MODEL="$FSGPU/random-smollm2-f16.gguf"
if [ ! -f "$MODEL" ]; then
  python3 -m bench.gpu gguf "$MODEL.tmp" --hidden 576 --layers 30 --ffn 1536 --heads 9 --kv-heads 3 \
    --vocab 49152 --ctx 2048 --pool && mv "$MODEL.tmp" "$MODEL" || exit 1
fi
echo "setup done at $(( $(date +%s) - T0 )) s"
pids=()
for w in $(seq 0 $(( WORKERS - 1 ))); do
  server_cpu=$(( 2 + 2 * w )); client_cpu=$(( 3 + 2 * w ))
  python3 - "$server_cpu" "$MODEL" "$FSGPU/cpu/bin/llama-server" "$FSGPU/space-$w.yaml" <<'PY'
import sys, yaml
cpu, model, server, out = sys.argv[1:]
doc = yaml.safe_load(open("bench/experiments/shared_server/space.yaml"))
doc["engines"]["llamacpp"]["command"] = [server]
doc["engines"]["llamacpp"]["cpus"] = cpu
doc["models"] = [{"name": "random-smollm2-f16", "path": model}]
yaml.safe_dump(doc, open(out, "w"), sort_keys=False)
PY
  taskset -c "$client_cpu" python3 -m bench.experiments.shared_server.run --space "$FSGPU/space-$w.yaml" \
    --pairs "$PAIRS" --segment 4 --out "$OUT/shared-server-$w.json" --logs "$FSGPU/logs-$w" \
    > "$FSGPU/worker-$w.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for w in $(seq 0 $(( WORKERS - 1 ))); do echo "== worker $w"; tail -12 "$FSGPU/worker-$w.log"; done
echo "done at $(( $(date +%s) - T0 )) s"
