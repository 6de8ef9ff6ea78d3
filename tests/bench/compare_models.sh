#!/usr/bin/env bash
# Side by side, in one run, ROUNDS times interleaved: `keel bench lenet|resnet` against the same
# model in PyTorch (tests/bench/torch_models.py), both single-threaded (OPENBLAS_NUM_THREADS=1 and
# torch.set_num_threads(1); keel --cpu_math_threads=1). Prints the JSON lines, then the median
# step-time ratios keel/torch.
#   tests/bench/compare_models.sh [ROUNDS] [BUILD_DIR]
set -euo pipefail
rounds=${1:-3}
build=${2:-build}
here=$(cd "$(dirname "$0")/../.." && pwd)
mnist=${KEEL_MNIST_DIR:-${KEEL_MNIST:-$here/../shared/data/mnist}}
keel=$build/bin/keel
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$rounds"); do
  "$keel" bench lenet --data=mnist:"$mnist" --batch_size=64 --bench_steps=50 --cpu_math_threads=1 |
    sed 's/^/lenet keel /' | tee -a "$out"
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 "$here/tests/bench/torch_models.py" --model lenet --batch 64 |
    sed 's/^/lenet torch /' | tee -a "$out"
  "$keel" bench resnet --batch_size=32 --bench_steps=20 --bench_warmup=3 --cpu_math_threads=1 |
    sed 's/^/resnet keel /' | tee -a "$out"
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 "$here/tests/bench/torch_models.py" --model resnet --batch 32 --steps 20 |
    sed 's/^/resnet torch /' | tee -a "$out"
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    model, system, js = line.split(" ", 2)
    rows.setdefault((model, system), []).append(json.loads(js)["step_ms"])
summary = {}
for m in ("lenet", "resnet"):
    k, t = statistics.median(rows[(m, "keel")]), statistics.median(rows[(m, "torch")])
    summary[m] = {"keel_step_ms": k, "torch_step_ms": t, "ratio": round(k / t, 3)}
print(json.dumps(summary))
PY
