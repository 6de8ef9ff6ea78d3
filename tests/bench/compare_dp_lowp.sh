#!/usr/bin/env bash
# 16-bit all-reduce and gradient merge on 2 workers, side by side in one run, interleaved for
# ROUNDS rounds, all on the seed MLP (batch 128 per worker):
#   w1        one worker (`keel bench mlp`, a math thread per core): the scaling baseline;
#   f32       2 workers (`keel launch --nproc_per_node=2`), float32 all-reduce;
#   bf16      2 workers, --fp16_allreduce=bf16 (half the bytes);
#   fp16      2 workers, --fp16_allreduce=fp16;
#   gm4       2 workers, --gradient_merge_k=4 (an all-reduce and an update every 4th step).
# The 2-worker rows run with --profile: rank 0's per-step all-reduce time (c_allreduce_sum's total
# over the timed steps, divided by the steps; it includes waiting for the other rank) is read from
# the profile summary keel prints.
# Prints every row, `uptime` before each round, then medians and the ratios the goals are stated in:
# scaling = 2-worker samples/s / one worker's, bf16 all-reduce ms / float32's, gm4 / f32 samples/s.
#   tests/bench/compare_dp_lowp.sh KEEL_BINARY [ROUNDS] [STEPS]
set -euo pipefail
keel=${1:?usage: compare_dp_lowp.sh KEEL_BINARY [ROUNDS] [STEPS]}
rounds=${2:-3}
steps=${3:-200}
[ -x "$keel" ] || { echo "no keel binary at $keel" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/results
two() {  # TAG flags...: a 2-worker bench row with rank 0's all-reduce ms per step
  local tag=$1
  shift
  "$keel" launch --nproc_per_node=2 --log_dir="$tmp/log" "$keel" bench mlp --bench_steps="$steps" \
    --profile="$tmp/prof.json" "$@" >"$tmp/run.txt" 2>&1
  local ar
  ar=$(awk -v s="$steps" '$1 == "comm" && $2 == "c_allreduce_sum" {print $4 / s; exit}' "$tmp/run.txt")
  grep '^{' "$tmp/run.txt" | tail -1 |
    sed "s/^{/$tag {\"allreduce_ms_per_step\": ${ar:-0}, /" | tee -a "$out"
}
for r in $(seq "$rounds"); do
  echo "# round $r: $(uptime)"
  "$keel" bench mlp --bench_steps="$steps" 2>/dev/null | grep '^{' | sed 's/^/w1 /' | tee -a "$out"
  two f32
  two bf16 --fp16_allreduce=bf16
  two fp16 --fp16_allreduce=fp16
  two gm4 --gradient_merge_k=4
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    tag, js = line.split(" ", 1)
    rows.setdefault(tag, []).append(json.loads(js))
med = lambda t, f: statistics.median(r[f] for r in rows[t])
sps = {t: med(t, "samples_per_s") for t in rows}
ar = {t: round(med(t, "allreduce_ms_per_step"), 3) for t in rows if t != "w1"}
print(json.dumps({
    "rounds": len(rows["w1"]), "samples_per_s": sps, "allreduce_ms_per_step": ar,
    "scaling": {t: round(sps[t] / sps["w1"], 3) for t in rows if t != "w1"},
    "bf16_over_f32_allreduce_ms": round(ar["bf16"] / ar["f32"], 3) if ar["f32"] else None,
    "fp16_over_f32_allreduce_ms": round(ar["fp16"] / ar["f32"], 3) if ar["f32"] else None,
    "gm4_over_f32_samples_per_s": round(sps["gm4"] / sps["f32"], 3)}))
PY
