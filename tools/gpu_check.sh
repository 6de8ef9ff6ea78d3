#!/usr/bin/env bash
# The GPU check: keel's GPU tests (every CUDA kernel against its CPU twin, the models on
# CUDAPlace(0), CUDA graphs, GPU data parallelism), compute-sanitizer's memcheck on the model
# tests, and the GPU benchmarks side by side with PyTorch on the same GPU; ends with a summary
# table (also written to OUTDIR/summary.md).
#
# Two ways to run it. A lent GPU machine has little time and none of Debian's libraries, so the
# usual way is to build here and carry the result:
#
#   tools/gpu_check.sh bundle [BUILD]      # here, after a CUDA build (default BUILD: build):
#                                          # .gpu_bundle/keel_gpu.tar.xz, the binaries the check
#                                          # runs and the non-CUDA shared libraries they need
#   tools/gpu_check.sh run-bundle [OUTDIR] # on the GPU machine (carry .gpu_bundle)
#
# or build on the GPU machine itself (needs .debs/ there when it lacks the -dev packages):
#
#   tools/gpu_check.sh fetch-debs          # on a Debian machine with network: .debs/
#   tools/gpu_check.sh [OUTDIR]            # on the GPU machine: build into build-gpu/, then check
#
# The bundle should come from a portable build (cmake -DKEEL_NATIVE=OFF): the GPU machine's CPU
# is not this one. CUDA's own libraries (cudart, cuBLAS, cuDNN, NCCL) are the GPU machine's: the
# toolkit's, or PyTorch's nvidia-* wheels found through python3. GPU_CHECK_ONLY=tests|profile|bench|large
# limits a run to one part (a rerun after a fix).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# Test binaries, each NAME or NAME:GTEST_FILTER (the GPU half of a test that also runs on the CPU).
GPU_TESTS=(cuda_test cuda_kernels_test cuda_kernels2_test cudnn_ops_test cuda_graph_test
  gpu_data_parallel_test lowp_kernels_test "amp_convergence_test:AmpConvergenceGpu.*")
log() { echo "== gpu_check: $*"; }

DEB_PACKAGES=(libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler libgflags-dev libgflags2.2
  libgoogle-glog-dev libgoogle-glog0v6 libunwind8 libunwind-dev libgloo-dev libgloo0
  libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200 libeigen3-dev libgtest-dev libgmock-dev
  googletest zlib1g-dev libdnnl-dev libdnnl2 libgomp1)

mode=${1:-}
if [ "$mode" = fetch-debs ]; then
  mkdir -p .debs && cd .debs && apt-get download "${DEB_PACKAGES[@]}" && ls -la
  exit $?
fi

# --- bundle: here, after the build ------------------------------------------------------------
if [ "$mode" = bundle ]; then
  B=$(cd "${2:-build}" && pwd) || exit 1
  LIBKEEL=$(ls "$B"/libkeel.so "$B"/lib/libkeel.so 2>/dev/null | head -1)
  # The CUDA half is libkeel_cuda, beside libkeel (libkeel itself links no CUDA library).
  ls "$(dirname "$LIBKEEL")"/libkeel_cuda.so >/dev/null 2>&1 ||
    { echo "gpu_check: $B is not a CUDA build (no libkeel_cuda.so beside its libkeel.so)"; exit 1; }
  grep -q '^KEEL_NATIVE:BOOL=ON' "$B/CMakeCache.txt" &&
    echo "gpu_check: warning: $B was built with -march=native; the GPU machine's CPU may lack its instructions"
  S=$(mktemp -d)
  mkdir -p "$S/build/bin" "$S/build/tests" "$S/syslib"
  cp -a "$B"/bin/* "$S/build/bin/"
  LIBREL=$(dirname "${LIBKEEL#$B/}")     # where libkeel sits in the build folder: . or lib
  mkdir -p "$S/build/$LIBREL" && cp -a "$(dirname "$LIBKEEL")"/libkeel.so* "$(dirname "$LIBKEEL")"/libkeel_cuda.so* "$S/build/$LIBREL/"
  for t in "${GPU_TESTS[@]}"; do cp -a "$B/tests/${t%%:*}" "$S/build/tests/" || exit 1; done
  # Every shared library they load, except CUDA's (the GPU machine's own) and the C runtime.
  for f in "$S"/build/bin/* "$S"/build/tests/* "$S"/build/$LIBREL/libkeel.so "$S"/build/$LIBREL/libkeel_cuda.so; do ldd "$f"; done 2>/dev/null |
    awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/libkeel\.|/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so|/libcu|/libnccl|/libnvidia|/libnvrtc' |
    while read -r l; do cp -L "$l" "$S/syslib/"; done
  strip --strip-unneeded "$S"/build/bin/* "$S"/build/tests/* "$S"/build/$LIBREL/libkeel.so.* "$S"/build/$LIBREL/libkeel_cuda.so.* 2>/dev/null
  # The real MNIST test set, for the LeNet test (KEEL_MNIST_DIR there).
  MNIST=${KEEL_MNIST_DIR:-$ROOT/../shared/data/mnist}
  [ -f "$MNIST/t10k-images-idx3-ubyte.gz" ] && mkdir -p "$S/mnist" && cp "$MNIST"/t10k-*.gz "$S/mnist/"
  echo "$B" >"$S/build_dir"           # where the binaries expect their build folder
  echo "$ROOT" >"$S/source_dir"
  git -C "$ROOT" rev-parse HEAD >"$S/commit" 2>/dev/null
  mkdir -p .gpu_bundle
  tar -C "$S" -cf - . | xz -T0 -6 >.gpu_bundle/keel_gpu.tar.xz
  rm -rf "$S"
  ls -la .gpu_bundle
  exit 0
fi

if [ "$mode" = run-bundle ]; then OUT=${2:-gpu_check_out}; else OUT=${1:-gpu_check_out}; fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
declare -A RESULT
command -v nvidia-smi >/dev/null &&
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
grep -m1 'model name' /proc/cpuinfo
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)

# CUDA's libraries: the toolkit's, then PyTorch's nvidia-* wheels (cuDNN, NCCL, cuBLAS).
CUDA_LIBDIRS=()
[ -x "$NVCC" ] && CUDA_LIBDIRS+=("$(dirname "$NVCC")/../lib64")
WHEELS=$(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d) for p in nvidia.__path__ for d in sorted(os.listdir(p))))' 2>/dev/null)
for d in $WHEELS; do [ -d "$d/lib" ] && CUDA_LIBDIRS+=("$d/lib"); done
CUDA_LD=$(IFS=:; echo "${CUDA_LIBDIRS[*]:-}")

if [ "$mode" = run-bundle ]; then
  [ -f .gpu_bundle/keel_gpu.tar.xz ] || { echo "gpu_check: no .gpu_bundle/keel_gpu.tar.xz (run: tools/gpu_check.sh bundle, and carry .gpu_bundle)"; exit 1; }
  U=$ROOT/.gpu_bundle/unpacked
  rm -rf "$U" && mkdir -p "$U" && xz -dc .gpu_bundle/keel_gpu.tar.xz | tar -C "$U" -xf - || exit 1
  log "bundle of commit $(cat "$U/commit" 2>/dev/null)"
  # The tests find the binaries under the build folder they were built in (an absolute path).
  # and the sources under the folder they were built from: link both paths here.
  SRC_WANT=$(cat "$U/source_dir")
  if [ "$SRC_WANT" != "$ROOT" ] && [ ! -e "$SRC_WANT" ]; then
    mkdir -p "$(dirname "$SRC_WANT")" && ln -s "$ROOT" "$SRC_WANT"
  fi
  WANT=$(cat "$U/build_dir")
  [ -e "$WANT" ] && [ ! -L "$WANT" ] && { echo "gpu_check: $WANT exists and is not the bundle's"; exit 1; }
  mkdir -p "$(dirname "$WANT")" && ln -sfn "$U/build" "$WANT"
  B=$WANT
  [ -d "$U/mnist" ] && export KEEL_MNIST_DIR=${KEEL_MNIST_DIR:-$U/mnist}
  export LD_LIBRARY_PATH=$B:$B/lib:$U/syslib:$CUDA_LD:${LD_LIBRARY_PATH:-}
  log "libraries not found:"
  for f in "$B"/bin/* "$B"/tests/*; do ldd "$f" | grep 'not found'; done | sort -u | tee "$OUT/ldd_missing.txt"
  RESULT[build]="prebuilt bundle ($(cat "$U/commit" 2>/dev/null | cut -c1-10))"
else
  # --- build on the GPU machine ---------------------------------------------------------------
  [ -x "$NVCC" ] || { echo "gpu_check: no nvcc found"; exit 1; }
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
  CUDA_INC=$(dirname "$NVCC")/../include
  for pkg in cudnn nccl; do
    if [ ! -f "$CUDA_INC/$pkg.h" ]; then
      d=$(python3 -c "import nvidia.$pkg as m; print(list(m.__path__)[0])" 2>/dev/null)
      if [ -n "$d" ]; then
        PREFIXES+=("$d")
        [ -e "$d/lib/lib$pkg.so" ] || { f=$(ls "$d"/lib/lib$pkg.so.* | head -1); mkdir -p "$OUT/lib"; ln -sf "$f" "$d/lib/lib$pkg.so" 2>/dev/null || ln -sf "$f" "$OUT/lib/lib$pkg.so"; PREFIXES+=("$OUT"); }
        [ $pkg = cudnn ] && EXTRA+=(-DKEEL_CUDNN_ROOT=$d)
      fi
    fi
  done
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$CUDA_LD
  PREFIX_PATH=$(IFS=';'; echo "${PREFIXES[*]:-}")
  log "configure + build (build-gpu/)"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKEEL_WITH_CUDA=ON -DKEEL_NATIVE=ON \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_PREFIX_PATH="$PREFIX_PATH" "${EXTRA[@]}" \
    >"$OUT/configure.log" 2>&1 && cmake --build build-gpu -j "$(nproc)" >"$OUT/build.log" 2>&1
  RESULT[build]=$([ $? -eq 0 ] && echo ok || echo "FAILED (see build.log)")
  if [ "${RESULT[build]}" != ok ]; then tail -30 "$OUT/configure.log" "$OUT/build.log"; fi
  B=$ROOT/build-gpu
fi
export KEEL_BIN=$B/bin/keel

if [ "${RESULT[build]}" != "FAILED (see build.log)" ]; then
  ONLY=${GPU_CHECK_ONLY:-all}
  if [ "$ONLY" = all ] || [ "$ONLY" = tests ]; then
    # The test binaries run at once (small kernels; the GPU has room), memcheck beside them.
    log "GPU tests and compute-sanitizer memcheck"
    for spec in "${GPU_TESTS[@]}"; do
      t=${spec%%:*}; filter=${GPU_TEST_FILTER:-}
      [ "$spec" != "$t" ] && filter=${filter:-${spec#*:}}
      timeout -k 5 "${GPU_TEST_TIMEOUT:-170}" "$B/tests/$t" --gtest_color=no \
        ${filter:+--gtest_filter=$filter} >"$OUT/test_$t.log" 2>&1 &
    done
    SAN=$(command -v compute-sanitizer || echo "$(dirname "$NVCC")/compute-sanitizer")
    if [ -x "$SAN" ] && [ "${GPU_CHECK_MEMCHECK:-1}" = 1 ]; then
      (
        rc=0
        # (Not the out-of-memory test: its refused cudaMalloc is an API error memcheck counts.)
        for spec in "cuda_kernels_test:CudaModels.*:CudaRuntime.*-CudaRuntime.OutOfMemory*" \
                    "cudnn_ops_test:CudnnOps.*:CudnnModels.LenetAndResnet*" \
                    "cuda_graph_test:CudaGraph.BuiltInModels*:CudaGraph.Replayed*" \
                    "lowp_kernels_test:LowpKernels.EveryCase*"; do
          t=${spec%%:*}
          timeout -k 5 "${GPU_MEMCHECK_TIMEOUT:-160}" "$SAN" --tool memcheck --error-exitcode 3 \
            "$B/tests/$t" --gtest_filter="${spec#*:}" >>"$OUT/memcheck.log" 2>&1 || rc=$?
        done
        exit $rc
      ) &
      SAN_PID=$!
    fi
    wait_tests() { for p in $(jobs -p); do [ "$p" = "${SAN_PID:-}" ] || wait "$p"; done; }
    wait_tests
    for spec in "${GPU_TESTS[@]}"; do
      t=${spec%%:*}
      f=$OUT/test_$t.log
      passed=$(grep -c '^\[       OK \]' "$f"); failed=$(grep -c '^\[  FAILED  \] [A-Za-z].*(' "$f")
      skipped=$(grep -c "^\[  SKIPPED \] .*ms)" "$f")
      verdict="$passed passed, $failed failed"
      [ "$skipped" -gt 0 ] && verdict="$verdict, $skipped SKIPPED"
      grep -q '^\[  PASSED  \]' "$f" || [ "$failed" -gt 0 ] || verdict="$verdict; did not finish: $(tail -c 160 "$f" | tr '\n' ' ')"
      RESULT[test_$t]=$verdict
    done
    if [ -n "${SAN_PID:-}" ]; then
      wait "$SAN_PID"; rc=$?
      RESULT[memcheck]=$([ $rc -eq 0 ] && echo clean || echo "rc $rc: $(grep -m1 -E 'ERROR SUMMARY: [1-9]|Invalid|error' "$OUT/memcheck.log" | cut -c1-150)")
    else
      RESULT[memcheck]="not run"
    fi
  fi
  if [ "$ONLY" = all ] || [ "$ONLY" = profile ]; then
    # Where each model's device time goes: every op waited for (FLAGS_profile_sync_ops), its span
    # in the per-op summary (profile_MODEL_AMP.txt); the table keeps the three largest ops.
    log "profiles: device time per op"
    for m in mlp resnet transformer; do
      b=128; [ $m = transformer ] && b=64
      for a in off fp16; do
        f=$OUT/profile_${m}_$a
        FLAGS_profile_sync_ops=true FLAGS_selected_gpus=0 timeout -k 5 "${GPU_BENCH_TIMEOUT:-45}" "$KEEL_BIN" bench $m \
          --batch_size=$b --amp=$a --bench_steps=50 --profile="$f.trace.json" >"$f.txt" 2>&1
        rm -f "$f.trace.json"*
        RESULT[profile_${m}_$a]=$(awk '$1 == "op" || $1 == "comm" {printf "%s %sms %s; ", $2, $4, $6}' "$f.txt" | cut -d';' -f1-3)
      done
    done
  fi
  if [ "$ONLY" = all ] || [ "$ONLY" = bench ]; then
    log "benchmarks: keel (FLAGS_selected_gpus=0) and PyTorch on the same GPU"
    for m in mlp resnet transformer; do
      b=128; [ $m = transformer ] && b=64
      for g in "" _graph; do
        FLAGS_selected_gpus=0 timeout -k 5 "${GPU_BENCH_TIMEOUT:-45}" "$KEEL_BIN" bench $m --batch_size=$b ${g:+--cuda_graph} \
          >"$OUT/keel_$m$g.json" 2>"$OUT/keel_$m$g.log"
        RESULT[keel_$m$g]=$(tail -1 "$OUT/keel_$m$g.json" 2>/dev/null)
        [ -n "${RESULT[keel_$m$g]}" ] || RESULT[keel_$m$g]="failed: $(grep -m1 -iE 'error|fault|abort' "$OUT/keel_$m$g.log" | cut -c1-200)"
      done
    done
    # Mixed precision: step_ms of each --amp run (float32's above, same GPU, same run).
    for m in mlp resnet transformer; do
      b=128; [ $m = transformer ] && b=64
      row=""
      for a in fp16:O1 fp16:O2 bf16:O1 bf16:O2 fp16:O1:graph; do
        IFS=: read -r dt lvl g <<<"$a"
        f=$OUT/keel_${m}_${dt}_$lvl${g:+_graph}
        FLAGS_selected_gpus=0 timeout -k 5 "${GPU_BENCH_TIMEOUT:-45}" "$KEEL_BIN" bench $m --batch_size=$b \
          --amp=$dt --amp_level=$lvl ${g:+--cuda_graph} >"$f.json" 2>"$f.log"
        ms=$(grep -o '"step_ms": [0-9.]*' "$f.json" | tail -1 | cut -d' ' -f2)
        row="$row $a=${ms:-failed($(grep -m1 -iE 'error|fault|abort' "$f.log" | cut -c1-120))}"
      done
      RESULT[keel_${m}_amp]="step_ms$row"
    done
    # ResNet-20 with cuDNN's timed algorithm search, and with TF32 convolutions (PyTorch's
    # default for cuDNN: torch.backends.cudnn.allow_tf32).
    row=""
    for a in off:search off:search,tf32 fp16:search fp16:search,graph; do
      IFS=: read -r dt opts <<<"$a"
      f=$OUT/keel_resnet_${dt}_${opts//,/_}
      FLAGS_cudnn_exhaustive_search=true FLAGS_allow_tf32=$([[ $opts == *tf32* ]] && echo true || echo false) \
        FLAGS_selected_gpus=0 timeout -k 5 "${GPU_BENCH_TIMEOUT:-45}" "$KEEL_BIN" bench resnet --batch_size=128 \
        --amp=$dt $([[ $opts == *graph* ]] && echo --cuda_graph) >"$f.json" 2>"$f.log"
      ms=$(grep -o '"step_ms": [0-9.]*' "$f.json" | tail -1 | cut -d' ' -f2)
      row="$row $a=${ms:-failed($(grep -m1 -iE 'error|fault|abort' "$f.log" | cut -c1-120))}"
    done
    RESULT[keel_resnet_tuned]="step_ms$row"
    if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
      PYTHONUNBUFFERED=1 timeout -k 5 "${GPU_TORCH_TIMEOUT:-120}" python3 tests/bench/gpu_torch_bench.py >"$OUT/torch.json" 2>"$OUT/torch.log"
      RESULT[torch]=$(tr '\n' ' ' <"$OUT/torch.json")
      PYTHONUNBUFFERED=1 timeout -k 5 "${GPU_TORCH_TIMEOUT:-120}" python3 tests/bench/gpu_torch_bench.py amp >"$OUT/torch_amp.json" 2>"$OUT/torch_amp.log"
      RESULT[torch_amp]=$(grep -o '"run": "[a-z0-9_]*", "batch": [0-9]*, "step_ms": [0-9.]*' "$OUT/torch_amp.json" |
        sed 's/"run": "\([^"]*\)".*"step_ms": /\1=/' | tr '\n' ' ')
    else
      RESULT[torch]="no torch with CUDA"
    fi
    # How fast one or several host threads issue kernels (docs/gpu.md, "One launching thread").
    if [ -x "$NVCC" ] && "$NVCC" -O2 -std=c++17 -o "$OUT/cuda_launch_bench" tests/bench/cuda_launch_bench.cu \
        >"$OUT/cuda_launch_bench.log" 2>&1; then
      timeout -k 5 60 "$OUT/cuda_launch_bench" 10000 >"$OUT/launch.json" 2>>"$OUT/cuda_launch_bench.log"
      RESULT[launch]=$(sed 's/.*"case": "\([^"]*\)", "T": \([0-9]*\), "floats": \([0-9]*\).*"us_per_op": \([0-9.]*\).*/\1(T=\2,n=\3)=\4us/' \
        "$OUT/launch.json" | tr '\n' ' ')
      rm -f "$OUT/cuda_launch_bench"
    else
      RESULT[launch]="not built: $(head -c 200 "$OUT/cuda_launch_bench.log")"
    fi
  fi
  if [ "$ONLY" = all ] || [ "$ONLY" = large ]; then
    log "benchmarks at compute-bound sizes"
    # Compute-bound sizes, where 16-bit Tensor Cores can pay: the MLP 8192 wide at batch 4096 and
    # ResNet-20 at batch 1024, NCHW and channels last (PyTorch's twins: gpu_torch_bench.py large).
    for spec in "mlp:4096:--mlp_hidden=8192:mlp" "resnet:1024::resnet" \
        "resnet:1024:--data_format=NHWC:resnet_nhwc"; do
      IFS=: read -r m b extra label <<<"$spec"
      row=""
      for a in off:O1 fp16:O1 fp16:O2 bf16:O1; do
        IFS=: read -r dt lvl <<<"$a"
        f=$OUT/keel_${label}_large_${dt}_$lvl
        FLAGS_selected_gpus=0 timeout -k 5 "${GPU_BENCH_TIMEOUT:-45}" "$KEEL_BIN" bench $m --batch_size=$b $extra \
          --bench_steps=30 --bench_warmup=3 --amp=$dt $([ $dt = off ] || echo --amp_level=$lvl) >"$f.json" 2>"$f.log"
        ms=$(grep -o '"step_ms": [0-9.]*' "$f.json" | tail -1 | cut -d' ' -f2)
        row="$row ${a/off:O1/f32}=${ms:-failed($(grep -m1 -iE 'error|fault|abort' "$f.log" | cut -c1-120))}"
      done
      RESULT[keel_${label}_large]="batch $b $extra step_ms$row"
    done
    if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
      PYTHONUNBUFFERED=1 timeout -k 5 "${GPU_TORCH_TIMEOUT:-120}" python3 tests/bench/gpu_torch_bench.py large >"$OUT/torch_large.json" 2>"$OUT/torch_large.log"
      RESULT[torch_large]=$(grep -o '"run": "[a-z0-9_]*", "batch": [0-9]*, "step_ms": [0-9.]*' "$OUT/torch_large.json" |
        sed 's/"run": "\([^"]*\)".*"step_ms": /\1=/' | tr '\n' ' ')
    fi
  fi
fi

echo
echo "| check | result |"
echo "| --- | --- |"
TEST_KEYS=()
for spec in "${GPU_TESTS[@]}"; do TEST_KEYS+=("test_${spec%%:*}"); done
for k in build "${TEST_KEYS[@]}" memcheck keel_mlp keel_mlp_graph keel_resnet keel_resnet_graph \
    keel_transformer keel_transformer_graph keel_mlp_amp keel_resnet_amp keel_transformer_amp keel_resnet_tuned keel_mlp_large keel_resnet_large keel_resnet_nhwc_large torch torch_large \
    torch_amp launch profile_mlp_off profile_mlp_fp16 profile_resnet_off profile_resnet_fp16 \
    profile_transformer_off profile_transformer_fp16; do
  echo "| $k | ${RESULT[$k]:-not run} |"
done | tee "$OUT/summary.md"
