# Sourced by the runs on the GPU machine's host CPU (bench/gpu/cpu_live.sh,
# bench/experiments/shared_server/device.sh): installs the carried wheels (.whl), exports
# PYTHONPATH/FLAGSEARCH_HOME, prints the CPU, and builds llama-server with the CPU backend only into
# $FSGPU/cpu (kept by a still-warm machine). Expects FSGPU and OUT to be set; returns non-zero on failure.
mkdir -p "$FSGPU" "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; return 1; }
export PYTHONPATH="/tmp/site:$PWD" FLAGSEARCH_HOME="$FSGPU/home"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)"
[ -x "$FSGPU/cpu/bin/llama-server" ] || GGML_CUDA=OFF bash bench/gpu/build_llama_cuda.sh .gpu/llama-src.tgz "$FSGPU/cpu"
