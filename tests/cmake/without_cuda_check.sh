#!/usr/bin/env bash
# keel on a machine without CUDA (issue: the package only ran where CUDA 13 was installed):
#   without_cuda_check.sh KEEL_BIN LIBKEEL
# 1. libkeel needs no CUDA library (its NEEDED entries);
# 2. with every CUDA library hidden (tools/run_without_cuda.sh), `keel train` trains the MLP on
#    the CPU, and asking it for a GPU is a clear error that names the CUDA backend, not a loader
#    failure at start.
set -euo pipefail
keel=$1 lib=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
needed=$(readelf -d "$lib" | grep NEEDED || true)
if grep -Eiq 'cuda|cublas|cudnn|nccl' <<<"$needed"; then
  echo "libkeel needs a CUDA library:"; grep -Ei 'cuda|cublas|cudnn|nccl' <<<"$needed"; exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
set +e
"$here/tools/run_without_cuda.sh" "$keel" train --model=mlp --steps=3 --batch_size=16 \
  --logtostderr > "$out/cpu.log" 2>&1
rc=$?
set -e
[ $rc -eq 77 ] && { cat "$out/cpu.log"; exit 77; }
if [ $rc -ne 0 ]; then echo "keel train on the CPU failed with CUDA hidden:"; cat "$out/cpu.log"; exit 1; fi
grep -q 'hidden /usr/local/cuda' "$out/cpu.log" || grep -q 'hidden nothing' "$out/cpu.log" ||
  { echo "nothing was hidden:"; cat "$out/cpu.log"; exit 1; }
set +e
"$here/tools/run_without_cuda.sh" "$keel" train --model=mlp --steps=1 --selected_gpus=0 \
  > "$out/gpu.log" 2>&1
rc=$?
set -e
if [ $rc -eq 0 ] || ! grep -q "CUDAPlace(0): keel's CUDA backend could not be loaded" "$out/gpu.log"; then
  echo "asking for a GPU with CUDA hidden did not name the missing backend (rc $rc):"
  cat "$out/gpu.log"; exit 1
fi
echo "without CUDA: trains on the CPU; a GPU is refused naming the backend"
