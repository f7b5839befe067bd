#!/usr/bin/env bash
# Builds llama-server with CUDA for Hopper (sm_90) from the trimmed llama.cpp source tarball
# (llama-cpp-python 0.3.36's vendored tree, see docs/gpu-llamacpp.md), into DEST/bin/llama-server.
#   bash bench/gpu/build_llama_cuda.sh SRC.tgz DEST
set -euo pipefail
SRC_TGZ="$1"; DEST="$2"
if [ -x "$DEST/bin/llama-server" ]; then echo "llama-server (CUDA) already built: $DEST/bin/llama-server"; exit 0; fi
mkdir -p "$DEST/src" "$DEST/bin"
tar -xzf "$SRC_TGZ" -C "$DEST/src"
start=$(date +%s)
cmake -S "$DEST/src/llama.cpp" -B "$DEST/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF > "$DEST/cmake.log" 2>&1 \
  || { tail -30 "$DEST/cmake.log"; exit 1; }
cmake --build "$DEST/build" --target llama-server -j "$(nproc)" > "$DEST/build.log" 2>&1 \
  || { tail -40 "$DEST/build.log"; exit 1; }
cp "$DEST/build/bin/llama-server" "$DEST/bin/llama-server"
echo "llama-server (CUDA sm_90) built in $(( $(date +%s) - start )) s"
