#!/usr/bin/env bash
# Builds llama-server with CUDA for Hopper (sm_90) from the trimmed llama.cpp source tarball that
# scripts/prepare_gpu.sh makes (llama-cpp-python 0.3.36's vendored tree), into DEST/bin/llama-server.
#   bash bench/gpu/build_llama_cuda.sh SRC.tgz DEST
# CONFIGURE_ONLY=1 stops after cmake's configure step; GGML_CUDA=OFF configures the CPU backend only
# (scripts/prepare_gpu.sh uses both to check the trimmed tree on a machine without a GPU).
set -euo pipefail
SRC_TGZ="$1"; DEST="$2"
CUDA="${GGML_CUDA:-ON}"
if [ -z "${CONFIGURE_ONLY:-}" ] && [ -x "$DEST/bin/llama-server" ]; then
  echo "llama-server (CUDA) already built: $DEST/bin/llama-server"; exit 0
fi
mkdir -p "$DEST/src" "$DEST/bin"
tar -xzf "$SRC_TGZ" -C "$DEST/src"
start=$(date +%s)
cmake -S "$DEST/src/llama.cpp" -B "$DEST/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA="$CUDA" -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF > "$DEST/cmake.log" 2>&1 \
  || { tail -30 "$DEST/cmake.log"; exit 1; }
if [ -n "${CONFIGURE_ONLY:-}" ]; then
  echo "trimmed llama.cpp configures (GGML_CUDA=$CUDA): $(grep -c 'Including' "$DEST/cmake.log") backend(s):" \
    "$(grep -o 'Including [a-zA-Z]* backend' "$DEST/cmake.log" | paste -sd, -)"
  exit 0
fi
cmake --build "$DEST/build" --target llama-server -j "$(nproc)" > "$DEST/build.log" 2>&1 \
  || { tail -40 "$DEST/build.log"; exit 1; }
cp "$DEST/build/bin/llama-server" "$DEST/bin/llama-server"
echo "llama-server (CUDA=$CUDA, sm_90) built in $(( $(date +%s) - start )) s"
