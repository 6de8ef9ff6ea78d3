#!/usr/bin/env bash
# 16-bit all-reduce and gradient merge on 2 workers, side by side in one run, interleaved for
# ROUNDS rounds, all on the seed MLP (batch 128 per worker):
#   w1        one worker (`keel bench mlp`, a math thread per core): the scaling baseline;
#   f32       2 workers (`keel launch --nproc_per_node=2`), float32 all-reduce;
#   bf16      2 workers, --fp16_allreduce=bf16 (half the bytes);
#   fp16      2 workers, --fp16_allreduce=fp16;
#   gm4       2 workers, --gradient_merge_k=4 (an all-reduce and an update every 4th step);
#   gloo_f32, gloo_bf16  f32 and bf16 on Gloo rings (TCP over loopback, as across hosts);
#   ar_f32, ar_bf16   the all-reduce alone (`keel bench allreduce`, 2 workers): the MLP's 1.68 M
#                     gradients in float32 and in bfloat16, no training around it.
# The 2-worker rows run with --profile: rank 0's per-step all-reduce time (c_allreduce_sum's total
# over the timed steps, divided by the steps; it includes waiting for the other rank) is read from
# the profile summary keel prints; `own` is the all-reduces' own time, without that wait: per
# all-reduce, the shorter of the two ranks' spans (the rank that arrives last does not wait for the
# other to start), summed and divided by the steps.
# Prints every row, `uptime` before each round, then medians and the ratios the goals are stated in:
# scaling = 2-worker samples/s / one worker's, bf16 all-reduce ms / float32's, gm4 / f32 samples/s.
#   tests/bench/compare_dp_lowp.sh KEEL_BINARY [ROUNDS] [STEPS]
# LAUNCH_FLAGS: more flags for every `keel launch` (e.g. --cpu_bind=cores).
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
  "$keel" launch --nproc_per_node=2 ${LAUNCH_FLAGS:-} --log_dir="$tmp/log" "$keel" bench mlp --bench_steps="$steps" \
    --profile="$tmp/prof.json" "$@" >"$tmp/run.txt" 2>&1
  local ar own
  ar=$(awk -v s="$steps" '$1 == "comm" && $2 == "c_allreduce_sum" {print $4 / s; exit}' "$tmp/run.txt")
  own=$(python3 - "$tmp/prof.json" "$steps" <<'PY'
import json, sys
def spans(path):  # c_allreduce_sum durations (us) by all-reduce, in the order they ran
    d = json.load(open(path))
    out = {}
    for e in d["traceEvents"] if isinstance(d, dict) else d:
        if e.get("name") == "c_allreduce_sum" and "dur" in e:
            out.setdefault(e.get("args", {}).get("detail", ""), []).append((e["ts"], e["dur"]))
    return out
a, b = spans(sys.argv[1] + ".rank0"), spans(sys.argv[1] + ".rank1")
own = sum(min(x[1], y[1]) for k in a for x, y in zip(sorted(a[k]), sorted(b.get(k, []))))
print(round(own / 1000 / int(sys.argv[2]), 4))
PY
)
  grep '^{' "$tmp/run.txt" | tail -1 |
    sed "s/^{/$tag {\"allreduce_ms_per_step\": ${ar:-0}, \"allreduce_own_ms_per_step\": ${own:-0}, /" |
    tee -a "$out"
}
for r in $(seq "$rounds"); do
  echo "# round $r: $(uptime)"
  "$keel" bench mlp --bench_steps="$steps" 2>/dev/null | grep '^{' | sed 's/^/w1 /' | tee -a "$out"
  two f32
  two bf16 --fp16_allreduce=bf16
  two fp16 --fp16_allreduce=fp16
  two gm4 --gradient_merge_k=4
  FLAGS_cpu_comm_backend=gloo two gloo_f32
  FLAGS_cpu_comm_backend=gloo two gloo_bf16 --fp16_allreduce=bf16
  for t in f32 bf16; do  # the all-reduce alone, of the MLP's 1.68 M gradients
    "$keel" launch --nproc_per_node=2 ${LAUNCH_FLAGS:-} --log_dir="$tmp/log" "$keel" bench allreduce \
      --bench_steps="$steps" --fp16_allreduce="$([ $t = f32 ] && echo off || echo $t)" |
      grep '^{' | sed "s/^/ar_$t /" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows, alone = {}, {}
for line in open(sys.argv[1]):
    tag, js = line.split(" ", 1)
    (alone if tag.startswith("ar_") else rows).setdefault(tag, []).append(json.loads(js))
med = lambda t, f: statistics.median(r[f] for r in rows[t])
sps = {t: med(t, "samples_per_s") for t in rows}
ar = {t: round(med(t, "allreduce_ms_per_step"), 3) for t in rows if t != "w1"}
own = {t: round(med(t, "allreduce_own_ms_per_step"), 3) for t in rows if t != "w1"}
ratio = lambda d, a, b: round(d[a] / d[b], 3) if d[b] else None
print(json.dumps({
    "rounds": len(rows["w1"]), "samples_per_s": sps, "allreduce_ms_per_step": ar,
    "allreduce_own_ms_per_step": own,
    "scaling": {t: round(sps[t] / sps["w1"], 3) for t in rows if t != "w1"},
    "bf16_over_f32_allreduce_ms": ratio(ar, "bf16", "f32"),
    "fp16_over_f32_allreduce_ms": ratio(ar, "fp16", "f32"),
    "bf16_over_f32_allreduce_own_ms": ratio(own, "bf16", "f32"),
    "gloo_bf16_over_f32_allreduce_ms": ratio(ar, "gloo_bf16", "gloo_f32"),
    "gloo_bf16_over_f32_samples_per_s": round(sps["gloo_bf16"] / sps["gloo_f32"], 3),
    "gm4_over_f32_samples_per_s": round(sps["gm4"] / sps["f32"], 3),
    "allreduce_alone_ms": {t: statistics.median(r["allreduce_ms"] for r in alone[t]) for t in alone},
    "bf16_over_f32_allreduce_alone_ms": round(
        statistics.median(r["allreduce_ms"] for r in alone["ar_bf16"]) /
        statistics.median(r["allreduce_ms"] for r in alone["ar_f32"]), 3)}))
PY
