#!/usr/bin/env bash
# One command on a machine with an NVIDIA GPU: build keel with CUDA, run the GPU tests
# (ctest -L gpu), compute-sanitizer's memcheck on the model tests, and the GPU benchmarks side by
# side with PyTorch on the same GPU; ends with a summary table.
#
#   tools/gpu_check.sh fetch-debs   # on a Debian machine with network: the -dev packages as .debs
#                                   # into .debs/ (ignored by git), for a GPU machine that lacks them
#   tools/gpu_check.sh [OUTDIR]     # on the GPU machine (default OUTDIR: gpu_check_out)
#
# Needs: nvcc (CUDA 12+), cmake, ninja, a C++17 compiler, cuDNN and NCCL (the toolkit's, or
# PyTorch's nvidia-cudnn / nvidia-nccl wheels, found through python3), python3 with torch for the
# benchmarks. Debian's protobuf, gflags, glog, gloo, Eigen and GoogleTest come from the system or
# from .debs/ unpacked with dpkg -x into .debs/root (nothing is installed system-wide).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

DEB_PACKAGES=(libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler libgflags-dev libgflags2.2
  libgoogle-glog-dev libgoogle-glog0v6 libunwind8 libunwind-dev libgloo-dev libgloo0
  libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200 libeigen3-dev libgtest-dev libgmock-dev
  googletest zlib1g-dev libdnnl-dev libdnnl2 libgomp1)

if [ "${1:-}" = "fetch-debs" ]; then
  mkdir -p .debs && cd .debs && apt-get download "${DEB_PACKAGES[@]}" && ls -la
  exit $?
fi

OUT=${1:-gpu_check_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
declare -A RESULT
log() { echo "== gpu_check: $*"; }

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] || { echo "gpu_check: no nvcc found"; exit 1; }

# Debian libraries: from .debs/ when the system lacks them.
PREFIXES=()
EXTRA=()
if [ ! -f /usr/include/google/protobuf/message.h ] || [ ! -f /usr/include/glog/logging.h ] ||
   [ ! -f /usr/include/oneapi/dnnl/dnnl.h ]; then
  [ -d .debs ] || { echo "gpu_check: no system protobuf/glog and no .debs/ (run: tools/gpu_check.sh fetch-debs on a Debian machine)"; exit 1; }
  log "unpacking .debs into .debs/root"
  mkdir -p .debs/root
  for f in .debs/*.deb; do dpkg -x "$f" .debs/root || dpkg-deb -x "$f" .debs/root; done
  SYS=$ROOT/.debs/root/usr
  PREFIXES+=("$SYS")
  export PATH=$SYS/bin:$PATH
  export LD_LIBRARY_PATH=$SYS/lib/x86_64-linux-gnu:$SYS/lib:${LD_LIBRARY_PATH:-}
  EXTRA+=(-DProtobuf_PROTOC_EXECUTABLE=$SYS/bin/protoc -DEigen3_DIR=$SYS/share/eigen3/cmake
          -DGTest_DIR=$SYS/lib/x86_64-linux-gnu/cmake/GTest)
fi
# cuDNN and NCCL: the toolkit's, else PyTorch's wheels.
CUDA_INC=$(dirname "$NVCC")/../include
for pkg in cudnn nccl; do
  if [ ! -f "$CUDA_INC/$pkg.h" ]; then
    d=$(python3 -c "import nvidia.$pkg as m, os; print(list(m.__path__)[0])" 2>/dev/null)
    if [ -n "$d" ]; then
      PREFIXES+=("$d")
      export LD_LIBRARY_PATH=$d/lib:${LD_LIBRARY_PATH:-}
      [ -e "$d/lib/lib$pkg.so" ] || { f=$(ls "$d"/lib/lib$pkg.so.* | head -1); mkdir -p "$OUT/lib"; ln -sf "$f" "$d/lib/lib$pkg.so" 2>/dev/null || ln -sf "$f" "$OUT/lib/lib$pkg.so"; PREFIXES+=("$OUT"); }
      [ $pkg = cudnn ] && EXTRA+=(-DKEEL_CUDNN_ROOT=$d)
    fi
  fi
done
PREFIX_PATH=$(IFS=';'; echo "${PREFIXES[*]:-}")

log "configure + build (build-gpu/)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKEEL_WITH_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_PREFIX_PATH="$PREFIX_PATH" "${EXTRA[@]}" \
  >"$OUT/configure.log" 2>&1 && cmake --build build-gpu -j "$(nproc)" >"$OUT/build.log" 2>&1
RESULT[build]=$([ $? -eq 0 ] && echo ok || echo "FAILED (see build.log)")
if [ "${RESULT[build]}" != ok ]; then tail -30 "$OUT/configure.log" "$OUT/build.log"; fi

if [ "${RESULT[build]}" = ok ]; then
  log "ctest -L gpu"
  ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 900 >"$OUT/ctest_gpu.log" 2>&1
  RESULT[ctest_gpu]=$(grep -E 'tests passed|tests failed' "$OUT/ctest_gpu.log" | tail -1)
  # ctest counts a skipped test as passed: say how many skipped (no device visible).
  skipped=$(sed -n '/The following tests did not run/,$p' "$OUT/ctest_gpu.log" | grep -c '(Skipped)')
  [ "$skipped" -gt 0 ] && RESULT[ctest_gpu]="${RESULT[ctest_gpu]}; $skipped SKIPPED (no GPU visible?)"
  log "compute-sanitizer memcheck on the model tests"
  SAN=$(command -v compute-sanitizer || echo "$(dirname "$NVCC")/compute-sanitizer")
  if [ -x "$SAN" ]; then
    "$SAN" --tool memcheck --error-exitcode 3 build-gpu/tests/cuda_kernels_test \
      --gtest_filter='CudaModels.*:CudaRuntime.*' >"$OUT/memcheck.log" 2>&1
    rc=$?
    "$SAN" --tool memcheck --error-exitcode 3 build-gpu/tests/cudnn_ops_test \
      --gtest_filter='CudnnOps.*:CudnnModels.LenetAndResnet*' >>"$OUT/memcheck.log" 2>&1
    rc2=$?
    "$SAN" --tool memcheck --error-exitcode 3 build-gpu/tests/cuda_graph_test \
      --gtest_filter='CudaGraph.BuiltInModels*:CudaGraph.Replayed*' >>"$OUT/memcheck.log" 2>&1
    [ $? -eq 0 ] && [ $rc -eq 0 ] && [ $rc2 -eq 0 ]
    RESULT[memcheck]=$([ $? -eq 0 ] && echo clean || echo "errors (see memcheck.log)")
  else
    RESULT[memcheck]="compute-sanitizer not found"
  fi
  log "benchmarks: keel (FLAGS_selected_gpus=0) and PyTorch on the same GPU"
  for m in mlp resnet transformer; do
    b=128; [ $m = transformer ] && b=64
    FLAGS_selected_gpus=0 build-gpu/bin/keel bench $m --batch_size=$b >"$OUT/keel_$m.json" 2>"$OUT/keel_$m.log"
    RESULT[keel_$m]=$(tail -1 "$OUT/keel_$m.json" 2>/dev/null)
    [ -n "${RESULT[keel_$m]}" ] || RESULT[keel_$m]="failed: $(grep -m1 'error' "$OUT/keel_$m.log")"
    # The same step captured once into a CUDA graph and replayed (--cuda_graph).
    FLAGS_selected_gpus=0 build-gpu/bin/keel bench $m --batch_size=$b --cuda_graph \
      >"$OUT/keel_${m}_graph.json" 2>"$OUT/keel_${m}_graph.log"
    RESULT[keel_${m}_graph]=$(tail -1 "$OUT/keel_${m}_graph.json" 2>/dev/null)
    [ -n "${RESULT[keel_${m}_graph]}" ] ||
      RESULT[keel_${m}_graph]="failed: $(grep -m1 'error' "$OUT/keel_${m}_graph.log")"
  done
  if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    PYTHONUNBUFFERED=1 python3 tests/bench/gpu_torch_bench.py >"$OUT/torch.json" 2>"$OUT/torch.log"
    RESULT[torch]=$(cat "$OUT/torch.json")
  else
    RESULT[torch]="no torch with CUDA"
  fi
fi

echo
echo "| check | result |"
echo "| --- | --- |"
for k in build ctest_gpu memcheck keel_mlp keel_mlp_graph keel_resnet keel_resnet_graph \
    keel_transformer keel_transformer_graph torch; do
  echo "| $k | ${RESULT[$k]:-not run} |"
done | tee "$OUT/summary.md"
