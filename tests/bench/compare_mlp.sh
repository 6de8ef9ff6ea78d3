#!/usr/bin/env bash
# Side by side, in one run: `keel bench mlp` and the PyTorch anchor ($KEEL_ANCHORS/torch_mlp.py),
# interleaved for ROUNDS rounds, in two pairings:
#   strict:  both single-threaded (OPENBLAS_NUM_THREADS=1 for torch, --cpu_math_threads=1 for keel);
#   anchor:  torch as the anchor runs it (Debian's OpenBLAS then uses a thread per core for GEMM,
#            whatever torch.set_num_threads says) against keel's default (a BLAS thread per core).
# Prints every JSON line, then one JSON summary with the median step-time ratio keel/torch.
#   tests/bench/compare_mlp.sh [ROUNDS] [BUILD_DIR]
set -euo pipefail
rounds=${1:-3}
build=${2:-build}
here=$(cd "$(dirname "$0")/../.." && pwd)
anchor=${KEEL_ANCHORS:-$here/../shared/anchors}/torch_mlp.py
keel=$build/bin/keel
[ -x "$keel" ] || { echo "no $keel: build first" >&2; exit 1; }
[ -f "$anchor" ] || { echo "no anchor at $anchor (set KEEL_ANCHORS)" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  { echo "needs Debian's python3-torch and libopenblas0-pthread (apt-get install)" >&2; exit 1; }
out=$(mktemp)
for r in $(seq "$rounds"); do
  "$keel" bench mlp --bench_steps=200 --cpu_math_threads=1 | sed 's/^/strict keel /' | tee -a "$out"
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 "$anchor" --world 1 --steps 200 | sed 's/^/strict torch /' | tee -a "$out"
  "$keel" bench mlp --bench_steps=200 | sed 's/^/anchor keel /' | tee -a "$out"
  /usr/bin/python3 "$anchor" --world 1 --steps 200 | sed 's/^/anchor torch /' | tee -a "$out"
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    pairing, system, js = line.split(" ", 2)
    rows.setdefault((pairing, system), []).append(json.loads(js)["step_ms"])
summary = {"bench": "mlp", "rounds": len(rows[("strict", "keel")])}
for p in ("strict", "anchor"):
    k, t = statistics.median(rows[(p, "keel")]), statistics.median(rows[(p, "torch")])
    summary[p] = {"keel_step_ms": round(k, 3), "torch_step_ms": round(t, 3), "ratio": round(k / t, 3)}
print(json.dumps(summary))
PY
rm -f "$out"
