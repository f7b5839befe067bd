#!/usr/bin/env bash
# Device-side driver of the GPU validation, run through the `device` tool from the repo root with
# carry [".gpu", ".whl"] as prepared by `bash scripts/prepare_gpu.sh`. Installs the carried wheels,
# builds llama-server with CUDA (or reuses a carried .gpu/bin/llama-server from an earlier build),
# writes a random 1.1B f16 GGUF meanwhile, measures copy bandwidth, then by MODE:
#   search      (default) a real `search run` over bench/gpu/llamacpp-h100.yaml in the time left
#   interleave  a few configs re-measured interleaved (bench/gpu/interleave.py)
#   table       the ground-truth table (bench/gpu/table.py --plan table), resumable
#   calib       A/A and config pairs for the gate's power (bench/gpu/table.py --plan calib)
#   setups      several measurement setups one after another into one CSV (CSV_CALIB), for the noise
#               of each: SETUPS="S1 ARGS1;S2 ARGS2", each segment at most S seconds of table.py run
#               --plan calib ARGS (give each its own --run NAME); BIG=1 also writes a random 7.24B f16
#               GGUF (Mistral-7B's shape) as $FSGPU/random-7b-f16.gguf before anything is measured
# Everything worth keeping goes to $OUT: the llama-server binary (llama-server.xz.part*, put them in
# .gpu/bin/ and carry them to skip the ~4-minute build), logs, CSVs. CSVs found in .gpu/data/ or in
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
  python3 bench/gpu/make_random_gguf.py "$MODEL.tmp" > "$FSGPU/gguf.log" 2>&1 && mv "$MODEL.tmp" "$MODEL" &
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
  python3 bench/gpu/make_random_gguf.py "$BIG_MODEL.tmp" --hidden 4096 --layers 32 --ffn 14336 --heads 32 \
    --kv-heads 8 --pool && mv "$BIG_MODEL.tmp" "$BIG_MODEL"
fi
[ -n "$GGUF_PID" ] && { wait "$GGUF_PID"; cat "$FSGPU/gguf.log"; }
[ -f "$MODEL" ] || { echo "no model"; exit 1; }
echo "setup done at $(( $(date +%s) - T0 )) s"
[ -f "$FSGPU/bandwidth.json" ] || python3 bench/gpu/summarize.py bandwidth > "$FSGPU/bandwidth.json"
cat "$FSGPU/bandwidth.json"; cp "$FSGPU/bandwidth.json" "$OUT/"
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
resume() {  # the longest copy of CSV $1 (carried, or kept by a warm machine) into $OUT
  for src in ".gpu/data/$1" "$FSGPU/data/$1"; do
    if [ -f "$src" ] && [ "$(wc -l < "$src")" -gt "$(cat "$OUT/$1" 2>/dev/null | wc -l)" ]; then cp "$src" "$OUT/$1"; fi
  done
}
for mode in ${MODE:-search}; do  # several modes in one call: MODE="table calib"
case "$mode" in
  interleave)
    timeout "$(left)" python3 bench/gpu/interleave.py --rounds "${ROUNDS:-3}" --out "$OUT/interleave.md" 2>&1 | tail -30
    ;;
  table|calib)
    CSV="${CSV:-gpu_llamacpp_h100.csv}"; [ "$mode" = calib ] && CSV="${CSV_CALIB:-gpu_calib_h100.csv}"
    ARGS="${TABLE_ARGS:-}"; [ "$mode" = calib ] && ARGS="${CALIB_ARGS:-}"
    resume "$CSV"
    timeout "$(( $(left) + 20 ))" python3 bench/gpu/table.py run --plan "$mode" --csv "$OUT/$CSV" \
      --deadline-s "$(( $(left) - ${START_MARGIN_S:-25} ))" --logdir "$FSGPU/logs" $ARGS 2>&1 \
      | tee "$OUT/$mode.log"
    cp "$OUT/$CSV" "$FSGPU/data/$CSV"
    python3 bench/gpu/table.py show "$OUT/$CSV" | tail -60
    ;;
  setups)
    CSV="${CSV_CALIB:-gpu_calib_setups_h100.csv}"
    resume "$CSV"
    IFS=';' read -ra SEGMENTS <<< "${SETUPS:-}"
    for seg in "${SEGMENTS[@]}"; do
      read -r seg_s seg_args <<< "$seg"
      dl=$(( $(left) - ${START_MARGIN_S:-25} )); [ "$seg_s" -lt "$dl" ] && dl=$seg_s
      [ "$dl" -gt 10 ] || { echo "no time left for: $seg"; continue; }
      nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
      # shellcheck disable=SC2086
      timeout "$(( dl + 60 ))" python3 bench/gpu/table.py run --plan calib --csv "$OUT/$CSV" --deadline-s "$dl" \
        --logdir "$FSGPU/logs" $seg_args 2>&1 | tee -a "$OUT/setups.log"
    done
    cp "$OUT/$CSV" "$FSGPU/data/$CSV"
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
    ;;
  *)
    LEFT=$(( $(left) - 45 ))
    echo "search: $LEFT s left"
    if [ "$LEFT" -gt 60 ]; then
      timeout --signal=TERM "$LEFT" python3 -m search.cli run bench/gpu/llamacpp-h100.yaml --trials "${TRIALS:-12}" \
        --results "$FSGPU/results" --study llamacpp-h100 --timeout $(( LEFT - 50 )) 2>&1 | tee "$OUT/search.log" | tail -60
    fi
    python3 bench/gpu/summarize.py table "$FSGPU/results" --model "$MODEL" --bandwidth "$FSGPU/bandwidth.json" \
      --out "$OUT" | tee "$OUT/table.md"
    ;;
esac
done
echo "total $(( $(date +%s) - T0 )) s"
