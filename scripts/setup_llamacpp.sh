#!/usr/bin/env bash
# Builds llama-server (CPU) from the llama.cpp source vendored in the PyPI sdist of
# llama-cpp-python, once: FLAGSEARCH_HOME/engines/llama.cpp-VERSION/bin/llama-server.
source "$(dirname "$0")/common.sh"
VERSION="${1:-0.3.36}"
DEST="$FLAGSEARCH_HOME/engines/llama.cpp-$VERSION"
BIN="$DEST/bin/llama-server"
if [ -x "$BIN" ]; then log "llama-server ready: $BIN"; exit 0; fi
start=$(date +%s)
WORK="$FLAGSEARCH_HOME/build/llama-cpp-python-$VERSION"
rm -rf "$WORK"; mkdir -p "$WORK"
log "fetching the llama-cpp-python==$VERSION source distribution"
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
  "llama-cpp-python==$VERSION" -d "$WORK" 2>/dev/null \
  || "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
tar -xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
SRC=$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp)
rm -f "$SRC/.git"   # a dangling gitlink file breaks cmake's version lookup
command -v ninja >/dev/null 2>&1 || "$PYTHON" -m pip install --quiet ninja
GEN=(-G Ninja)
command -v ninja >/dev/null 2>&1 || GEN=()
# GGML_NATIVE=OFF is required here: the native build uses AMX and segfaults in warmup.
# LLAMA_USE_PREBUILT_UI=OFF stops it from trying to download a web UI.
cmake -S "$SRC" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF ${LLAMA_CMAKE_EXTRA:-} > "$WORK/cmake.log"
log "building llama-server (about 5-8 minutes on 2 cores)"
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" > "$WORK/build.log"
mkdir -p "$DEST/bin"
cp "$WORK/build/bin/llama-server" "$BIN"
(cd "$SRC" && cat "$WORK"/llama_cpp_python-*/vendor/llama.cpp/CMakeLists.txt >/dev/null; true)
rm -rf "$WORK"
log "llama-server built in $(( $(date +%s) - start )) s: $BIN"
