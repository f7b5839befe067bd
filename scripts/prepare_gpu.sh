#!/usr/bin/env bash
# Prepares, from the package index, everything the GPU validation (bench/gpu/run.sh) carries to
# the GPU machine, which cannot reach any registry:
#   .gpu/llama-src.tgz  llama.cpp's source as vendored by the llama-cpp-python sdist, trimmed to
#                       what a CUDA llama-server needs (22 MB instead of 176 MB; 4.8 MB as .tgz)
#   .whl/*.whl          cp312 wheels of the Python packages the GPU image lacks (or has too old:
#                       pydantic needs typing-extensions >= 4.16), for the GPU machine's platform:
#                       GPU_ARCH=x86_64 (default: an H100 host) or GPU_ARCH=aarch64 (a DGX Spark, GH200)
# then checks that the trimmed tree configures with the flags bench/gpu/build_llama_cuda.sh uses
# (CUDA on where this machine has nvcc, else the CPU backend; the CUDA build itself runs on the
# GPU machine). Both folders are git-ignored. Two commands for a newcomer (docs/gpu-llamacpp.md):
#   bash scripts/prepare_gpu.sh          # here, ~1-2 min
#   bash bench/gpu/run.sh                # on the GPU machine, carrying .gpu and .whl
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_SDIST="llama-cpp-python==0.3.36"
# The GPU image (KINDS.md of the device tool) already has numpy, scipy, pandas, httpx, pyyaml, rich,
# prometheus-client, psutil, matplotlib, requests, tqdm, packaging, attrs; these it lacks.
# Versions are the ones this project's .venv resolves to, so both machines run the same code.
WHEELS=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0
  optuna==5.0.0 alembic==1.20.1 sqlalchemy==2.1.9 mako==1.4.3 colorlog==6.12.0
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  docker==7.2.0 gguf==0.19.0
)
GPU_ARCH="${GPU_ARCH:-x86_64}"
case "$GPU_ARCH" in
  x86_64) CPU_ARCH_DIR=x86 ;;
  aarch64) CPU_ARCH_DIR=arm ;;
  *) echo "GPU_ARCH must be x86_64 or aarch64, not $GPU_ARCH" >&2; exit 2 ;;
esac
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014; do PLATFORMS+=(--platform "${tag}_$GPU_ARCH"); done
[ "$GPU_ARCH" = x86_64 ] && PLATFORMS+=(--platform manylinux1_x86_64)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p .gpu .whl

echo "== wheels ($GPU_ARCH) -> .whl/"
rm -f .whl/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"
ls .whl

echo "== $LLAMA_SDIST sdist -> trimmed llama.cpp"
python3 -m pip download -q --no-deps --no-binary=:all: --no-build-isolation -d "$WORK" "$LLAMA_SDIST" \
  || python3 -m pip download -q --no-deps --no-binary=:all: -d "$WORK" "$LLAMA_SDIST"
tar -xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
mv "$WORK"/llama_cpp_python-*/vendor/llama.cpp "$WORK/llama.cpp"
rm -rf "$WORK"/llama_cpp_python-*
L="$WORK/llama.cpp"
# The trim list. Whole top-level folders the server build never reads:
rm -rf "$L"/{docs,models,media,tests,examples,pocs,benches,gguf-py,conversion,requirements,ci,skills,app}
rm -rf "$L"/{.git,.github,.devops,.gemini,.pi}
rm -f "$L"/*.py "$L"/*.sh
# scripts/: only the UI-asset step that tools/ui's CMakeLists runs at build time is kept.
find "$L/scripts" -mindepth 1 ! -name ui-assets.cmake -exec rm -rf {} +
# ggml backends other than the CPU (always built) and CUDA:
for b in blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
  rm -rf "$L/ggml/src/ggml-$b"
done
# CPU backend: only the GPU machine's architecture (x86 or arm); SpacemiT's kernels go, and Arm's
# KleidiAI ones too on x86.
find "$L/ggml/src/ggml-cpu/arch" -mindepth 1 -maxdepth 1 ! -name "$CPU_ARCH_DIR" -exec rm -rf {} +
rm -rf "$L/ggml/src/ggml-cpu/spacemit"
[ "$GPU_ARCH" = x86_64 ] && rm -rf "$L/ggml/src/ggml-cpu/kleidiai"
# tools/: the server and what it links (mtmd, and ui, which embeds no assets when the web UI is off).
find "$L/tools" -mindepth 1 -maxdepth 1 ! -name server ! -name mtmd ! -name ui ! -name CMakeLists.txt \
  -exec rm -rf {} +
rm -rf "$L/tools/server/tests" "$L/tools/server/bench"
find "$L/tools/ui" -mindepth 1 -maxdepth 1 ! -name CMakeLists.txt ! -name '*.in' ! -name sources.cmake \
  -exec rm -rf {} +
# tools/CMakeLists.txt rewritten to add only those three (upstream also adds ~15 tools removed above).
cat > "$L/tools/CMakeLists.txt" <<'EOF'
# Trimmed by flagsearch scripts/prepare_gpu.sh: only llama-server and the libraries it links.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(ui)
add_subdirectory(mtmd)
add_subdirectory(server)
EOF
tar -czf .gpu/llama-src.tgz -C "$WORK" llama.cpp
echo "trimmed source: $(du -sh "$L" | cut -f1) unpacked, $(du -h .gpu/llama-src.tgz | cut -f1) as .gpu/llama-src.tgz"

if [ "$GPU_ARCH" != "$(uname -m)" ]; then
  echo "prepared for $GPU_ARCH on $(uname -m): the configure check runs only on the architecture it was trimmed for"
  exit 0
fi
echo "== configure check of the trimmed tree"
CUDA=OFF
command -v nvcc > /dev/null && CUDA=ON
if ! CONFIGURE_ONLY=1 GGML_CUDA="$CUDA" bash bench/gpu/build_llama_cuda.sh .gpu/llama-src.tgz "$WORK/check"; then
  if [ "$CUDA" = ON ]; then  # nvcc without cuBLAS and friends here: check the tree without CUDA instead
    echo "(CUDA configure failed on this machine; checking the tree with the CPU backend)"
    rm -rf "$WORK/check"
    CONFIGURE_ONLY=1 GGML_CUDA=OFF bash bench/gpu/build_llama_cuda.sh .gpu/llama-src.tgz "$WORK/check"
  else
    exit 1
  fi
fi
echo "prepared: .gpu/llama-src.tgz ($(du -h .gpu/llama-src.tgz | cut -f1)) and $(ls .whl | wc -l) wheels in .whl/" \
  "($(du -sh .whl | cut -f1)); next: bash bench/gpu/run.sh on the GPU machine, carrying .gpu and .whl" \
  "(.gpu/bin and .whl once the built llama-server parts are in .gpu/bin: the 64 MiB carry limit)"
