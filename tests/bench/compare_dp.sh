#!/usr/bin/env bash
# Side by side, in one run, ROUNDS times interleaved:
#   - 2 workers training the seed MLP: `keel launch --nproc_per_node=2 keel bench mlp` against the
#     anchor's torch DDP on Gloo (`torch_mlp.py --world 2`), samples/s;
#   - all-reduce of the MLP's 6.72 MB of gradients: `keel bench allreduce` against the anchor's raw
#     Gloo ring all-reduce (`gloo_allreduce.cc`, built here), ms;
#   - both keel rows once more with --cpu_comm_backend=gloo (keel's TCP path, what it uses across
#     hosts), next to the default (shared memory, as every rank is on this host).
# Prints every JSON line, then a JSON summary of median ratios.
#   tests/bench/compare_dp.sh [ROUNDS] [BUILD_DIR]
set -euo pipefail
rounds=${1:-3}
build=${2:-build}
here=$(cd "$(dirname "$0")/../.." && pwd)
anchors=${KEEL_ANCHORS:-$here/../shared/anchors}
keel=$build/bin/keel
[ -x "$keel" ] || { echo "no $keel: build first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
g++ -O2 "$anchors/gloo_allreduce.cc" -o "$tmp/gloo_allreduce" -lgloo -lpthread
out=$tmp/results
for r in $(seq "$rounds"); do
  "$keel" launch --nproc_per_node=2 --log_dir="$tmp/log" "$keel" bench mlp --bench_steps=100 |
    grep '^{' | sed 's/^/dp keel /' | tee -a "$out"
  /usr/bin/python3 "$anchors/torch_mlp.py" --world 2 --steps 100 | grep '^{' | sed 's/^/dp torch /' | tee -a "$out"
  "$keel" launch --nproc_per_node=2 --log_dir="$tmp/log" "$keel" bench mlp --bench_steps=100 \
    --cpu_comm_backend=gloo | grep '^{' | sed 's/^/dp keel-gloo /' | tee -a "$out"
  "$keel" launch --nproc_per_node=2 --log_dir="$tmp/log" "$keel" bench allreduce --bench_steps=30 |
    grep '^{' | sed 's/^/ar keel /' | tee -a "$out"
  "$keel" launch --nproc_per_node=2 --log_dir="$tmp/log" "$keel" bench allreduce --bench_steps=30 \
    --cpu_comm_backend=gloo | grep '^{' | sed 's/^/ar keel-gloo /' | tee -a "$out"
  d=$(mktemp -d -p "$tmp")
  "$tmp/gloo_allreduce" 1 2 1680000 30 "$d" & "$tmp/gloo_allreduce" 0 2 1680000 30 "$d" |
    sed 's/^/ar gloo /' | tee -a "$out"
  wait
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kind, system, js = line.split(" ", 2)
    rows.setdefault((kind, system), []).append(json.loads(js))
med = lambda k, s, f: statistics.median(r[f] for r in rows[(k, s)])
ks, ts = med("dp", "keel", "samples_per_s"), med("dp", "torch", "samples_per_s")
kgs = med("dp", "keel-gloo", "samples_per_s")
ka, ga = med("ar", "keel", "allreduce_ms"), med("ar", "gloo", "allreduce_ms")
kga = med("ar", "keel-gloo", "allreduce_ms")
print(json.dumps({"rounds": len(rows[("dp", "keel")]),
                  "dp2_mlp": {"keel_samples_per_s": ks, "torch_ddp_samples_per_s": ts,
                              "ratio": round(ks / ts, 3),
                              "keel_gloo_samples_per_s": kgs, "gloo_ratio": round(kgs / ts, 3)},
                  "allreduce_6.72MB": {"keel_ms": ka, "gloo_ms": ga, "ratio": round(ka / ga, 3),
                                       "keel_gloo_ms": kga, "gloo_ratio": round(kga / ga, 3)}}))
PY
