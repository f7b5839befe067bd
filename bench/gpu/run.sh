#!/usr/bin/env bash
# Device-side driver of the GPU validation, run through the `device` tool from the repo root with
# carry [".gpu", ".whl"] as prepared by `bash scripts/prepare_gpu.sh` (once .gpu/bin/llama-server.xz.part* exist,
# carry [".gpu/bin", ".whl"]: the source tarball only builds, and with it the tree, .gpu (46 MiB) and .whl (9 MiB)
# passed the device tool's 64 MiB carry limit on 2026-11-27). Installs the carried wheels,
# builds llama-server with CUDA (or reuses a carried .gpu/bin/llama-server from an earlier build),
# writes a random 1.1B f16 GGUF meanwhile, measures copy bandwidth, then by MODE:
#   search      (default) a real `search run` over bench/gpu/llamacpp-h100.yaml in the time left
#   setup       nothing measured: the build and the models only (later calls of a warm machine reuse them)
#   table       the ground-truth table (python -m bench.ground_truth run bench/tables/gpu-llamacpp.yaml),
#               resumable
#   calib       repetitions of `search ab` for pairs of configs (python -m bench.calibrate measure
#               --space bench/gpu/llamacpp-h100.yaml $CALIB_ARGS), e.g.
#               CALIB_ARGS="--pairs A-A2,A-set:cache_type_k=q8_0 --reps 20 --cap 6"
# BIG=1 also writes a random 7.24B f16 GGUF (Mistral-7B's shape) as $FSGPU/random-7b-f16.gguf before
# anything is measured. Everything that starts a server goes through the product's Session.run.
# Everything worth keeping goes to $OUT: the llama-server binary (llama-server.xz.part*, put them in
# .gpu/bin/ and carry them to skip the ~4-minute build), logs, CSVs. Files found in .gpu/data/ or in
# $FSGPU/data (a still-warm machine) are resumed, not restarted.
set -uo pipefail
export PYTHONUNBUFFERED=1 FSGPU="${FSGPU:-/tmp/fsgpu}"
OUT="${OUT:-/tmp/fsgpu-out}"
BUDGET_S="${BUDGET_S:-560}"   # the whole command must end inside the device tool's 600 s
T0=$(date +%s)
mkdir -p "$FSGPU/bin" "$FSGPU/data" "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv,noheader
nvcc --version | tail -2
MODEL="$FSGPU/random-1b-f16.gguf"
GGUF_PID=""
if [ ! -f "$MODEL" ]; then
  python3 -m bench.gpu gguf "$MODEL.tmp" > "$FSGPU/gguf.log" 2>&1 && mv "$MODEL.tmp" "$MODEL" &
  GGUF_PID=$!
fi
if [ ! -x "$FSGPU/bin/llama-server" ] && [ -f .gpu/bin/llama-server.xz.part00 ]; then
  cat .gpu/bin/llama-server.xz.part* | xz -dc > "$FSGPU/bin/llama-server"; chmod +x "$FSGPU/bin/llama-server"
  "$FSGPU/bin/llama-server" --version 2>&1 | tail -2 || rm -f "$FSGPU/bin/llama-server"
fi
bash bench/gpu/build_llama_cuda.sh .gpu/llama-src.tgz "$FSGPU" || exit 1
if [ ! -f .gpu/bin/llama-server.xz.part00 ]; then  # not carried: send this build back
  # back through $OUT (16 MiB a file): stripped, xz-compressed, in 15 MiB parts; join with cat, unxz
  strip -o "$FSGPU/llama-server.stripped" "$FSGPU/bin/llama-server" && xz -T0 -6 -c "$FSGPU/llama-server.stripped" \
    | split -b 15M -d - "$OUT/llama-server.xz.part"
  ls -la "$OUT"/llama-server.xz.part*
  ldd "$FSGPU/bin/llama-server" | tee "$OUT/llama-server.ldd"
fi
BIG_MODEL="$FSGPU/random-7b-f16.gguf"
if [ -n "${BIG:-}" ] && [ ! -f "$BIG_MODEL" ]; then  # 14.5 GB; written before any measurement, not during
  python3 -m bench.gpu gguf "$BIG_MODEL.tmp" --hidden 4096 --layers 32 --ffn 14336 --heads 32 \
    --kv-heads 8 --pool && mv "$BIG_MODEL.tmp" "$BIG_MODEL"
fi
[ -n "$GGUF_PID" ] && { wait "$GGUF_PID"; cat "$FSGPU/gguf.log"; }
[ -f "$MODEL" ] || { echo "no model"; exit 1; }
echo "setup done at $(( $(date +%s) - T0 )) s"
[ -f "$FSGPU/bandwidth.json" ] || python3 -m bench.gpu bandwidth > "$FSGPU/bandwidth.json"
cat "$FSGPU/bandwidth.json"; cp "$FSGPU/bandwidth.json" "$OUT/"
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
resume() {  # the longest copy of CSV $1 (carried, or kept by a warm machine) into $OUT
  for src in ".gpu/data/$1" "$FSGPU/data/$1"; do
    if [ -f "$src" ] && [ "$(wc -l < "$src")" -gt "$(cat "$OUT/$1" 2>/dev/null | wc -l)" ]; then cp "$src" "$OUT/$1"; fi
  done
}
for mode in ${MODE:-search}; do  # several modes in one call: MODE="table calib"
case "$mode" in
  setup) ;;
  table)
    CSV="${CSV:-gpu_llamacpp.csv}"
    resume "$CSV"
    timeout "$(( $(left) - ${START_MARGIN_S:-25} ))" python3 -m bench.ground_truth run bench/tables/gpu-llamacpp.yaml \
      --out "$OUT/$CSV" --minutes "$(( ($(left) - ${START_MARGIN_S:-25} - 60) / 60 ))" ${TABLE_ARGS:-} 2>&1 \
      | tee "$OUT/table.log"
    cp "$OUT/$CSV" "$FSGPU/data/$CSV"
    python3 -m bench.ground_truth show "$OUT/$CSV" | tail -60
    ;;
  calib)
    OUTF="${CALIB_OUT:-gpu_calib_live.json}"
    timeout "$(( $(left) - ${START_MARGIN_S:-25} ))" python3 -m bench.calibrate measure \
      --space "${CALIB_SPACE:-bench/gpu/llamacpp-h100.yaml}" --out "$OUT/$OUTF" \
      --minutes "$(( ($(left) - ${START_MARGIN_S:-25} - 90) / 60 ))" ${CALIB_ARGS:-} 2>&1 | tee "$OUT/calib.log"
    ;;
  *)
    LEFT=$(( $(left) - 45 ))
    echo "search: $LEFT s left"
    if [ "$LEFT" -gt 60 ]; then
      timeout --signal=TERM "$LEFT" python3 -m search.cli run bench/gpu/llamacpp-h100.yaml --trials "${TRIALS:-12}" \
        --results "$FSGPU/results" --study llamacpp-h100 --timeout $(( LEFT - 50 )) 2>&1 | tee "$OUT/search.log" | tail -60
    fi
    python3 -m bench.gpu roofline "$FSGPU/results" --model "$MODEL" --bandwidth "$FSGPU/bandwidth.json" \
      --out "$OUT" | tee "$OUT/table.md"
    ;;
esac
done
echo "total $(( $(date +%s) - T0 )) s"
