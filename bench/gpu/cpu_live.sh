#!/usr/bin/env bash
# The gate's live calibration on a calm many-core CPU (the GPU machine's host CPU, no GPU used):
# repetitions of `search ab`'s interleaved fresh-start comparison (python -m bench.calibrate measure)
# of llama-server at `-t 1`, A/A and A against itself behind a 5% stretch (arm S5), judged one-sided
# as `search regress` judges (--sides 1), up to 10 starts a side. WORKERS comparisons run at once,
# each with its server pinned to one core and its client to another (no two share a core).
# Run through the `device` tool from the repo root with carry [".gpu", ".whl"] (scripts/prepare_gpu.sh):
#   WORKERS=7 DEADLINE_S=560 bash bench/gpu/cpu_live.sh
# Builds llama-server with the CPU backend only, writes a small random-weight f16 GGUF (the settings
# of bench/tables/calibrate-cpu.yaml are kept, its model is not: see MODEL below), and
# writes each worker's measure file to $OUT/live-<worker>-<tag>.json (resumable: a still-warm machine
# keeps the build and the model under $FSGPU; each call writes new files).
set -uo pipefail
export PYTHONUNBUFFERED=1 FSGPU="${FSGPU:-/tmp/fsgpu}"
OUT="${OUT:-/tmp/fsgpu-out}"
WORKERS="${WORKERS:-7}"
DEADLINE_S="${DEADLINE_S:-560}"  # the whole command ends inside the device tool's 600 s
REPS="${REPS:-4}"
TAG="${TAG:-$(date +%H%M%S)}"
T0=$(date +%s)
source bench/gpu/cpu_host.sh || exit 1
# A small llama (27M parameters, f16: 54 MB) keeps a start to seconds on one core; SmolLM2-135M's own
# shape in f16 (the generator writes f16 only) decodes at a few tokens a second there.
MODEL="$FSGPU/random-27m-f16.gguf"
if [ ! -f "$MODEL" ]; then
  python3 -m bench.gpu gguf "$MODEL.tmp" --hidden 384 --layers 12 --ffn 1024 --heads 6 --kv-heads 2 \
    --vocab 16384 --ctx 2048 --pool && mv "$MODEL.tmp" "$MODEL" || exit 1
fi
echo "setup done at $(( $(date +%s) - T0 )) s"
left=$(( DEADLINE_S - ($(date +%s) - T0) ))
# No new repetition after this many minutes: an A/A at the cap of 10 takes about 2 minutes here.
minutes=$(python3 -c "print(max(0.5, ($left - 150) / 60))")
pids=()
for w in $(seq 0 $(( WORKERS - 1 ))); do
  server_cpu=$(( 2 + 2 * w )); client_cpu=$(( 3 + 2 * w ))
  python3 - "$w" "$server_cpu" "$MODEL" "$FSGPU/cpu/bin/llama-server" "$FSGPU/space-$w.yaml" <<'EOF'
import sys, yaml
w, cpu, model, server, out = sys.argv[1:]
doc = yaml.safe_load(open("bench/tables/calibrate-cpu.yaml"))
doc["name"] = f"calibrate-cpu-live-{w}"
doc["engines"]["llamacpp"]["command"] = [server]
doc["engines"]["llamacpp"]["cpus"] = cpu
doc["models"] = [{"name": "random-27m-f16", "path": model}]
yaml.safe_dump(doc, open(out, "w"), sort_keys=False)
EOF
  # Stopped at the deadline wherever it is: the measure file holds every repetition finished.
  timeout -k 5 $(( left - 20 )) taskset -c "$client_cpu" python3 -m bench.calibrate measure --space "$FSGPU/space-$w.yaml" --pairs A-A2,A-S5 \
    --reps "$REPS" --cap 10 --sides 1 --minutes "$minutes" --out "$OUT/live-$w-$TAG.json" \
    > "$FSGPU/worker-$w-$TAG.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for w in $(seq 0 $(( WORKERS - 1 ))); do echo "== worker $w"; grep -E "^rep " "$FSGPU/worker-$w-$TAG.log"; \
  tail -3 "$FSGPU/worker-$w-$TAG.log" | grep -iE "error|Traceback" ; done
echo "done at $(( $(date +%s) - T0 )) s"
