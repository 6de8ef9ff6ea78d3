#!/usr/bin/env bash
# Mixed precision, side by side in one run: `keel bench mlp|resnet` in float32, bfloat16 O1 and
# bfloat16 O2 against PyTorch 2.x's CPU autocast (torch2_mlp.py / torch2_models.py --amp bf16,
# with MKL's fast path, --mkl_fake_intel, the strongest anchor), interleaved for ROUNDS rounds:
#   mlp1    the seed MLP, batch 128, one math thread each;
#   resnetT ResNet-20, batch 32, T = 1 and 2 math threads each.
# Prints every JSON line, `uptime` before each round, then per bench the median step_ms and the
# ratios the mixed-precision goals are stated in: keel bf16 / keel float32 and
# keel bf16 / torch autocast bf16.
#   tests/bench/compare_amp.sh KEEL_BINARY [ROUNDS]
# The anchors: $KEEL_ANCHORS (default ~/.cache/keel-anchors) holds the torch2/ virtual environment;
# $ANCHOR_DIR the anchor scripts (torch2_mlp.py, torch2_models.py).
set -euo pipefail
keel=${1:?usage: compare_amp.sh KEEL_BINARY [ROUNDS]}
rounds=${2:-3}
tpy=${TORCH2_PY:-${KEEL_ANCHORS:-$HOME/.cache/keel-anchors}/torch2/bin/python}
adir=${ANCHOR_DIR:?set ANCHOR_DIR to the directory of torch2_mlp.py and torch2_models.py}
[ -x "$keel" ] || { echo "no keel binary at $keel" >&2; exit 1; }
[ -x "$tpy" ] || { echo "no PyTorch 2 environment at $tpy (set KEEL_ANCHORS or TORCH2_PY)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
row() {  # TAG SYSTEM -- command...
  local tag=$1 sys=$2
  shift 3
  "$@" 2>/dev/null | tail -1 | sed "s/^/$tag $sys /" | tee -a "$out"
}
for r in $(seq "$rounds"); do
  echo "# round $r: $(uptime)"
  row mlp1 keel_f32 -- "$keel" bench mlp --bench_steps=200 --cpu_math_threads=1
  row mlp1 keel_o1 -- "$keel" bench mlp --bench_steps=200 --cpu_math_threads=1 --amp=bf16
  row mlp1 keel_o2 -- "$keel" bench mlp --bench_steps=200 --cpu_math_threads=1 --amp=bf16 --amp_level=O2
  row mlp1 torch_f32 -- "$tpy" "$adir/torch2_mlp.py" --world 1 --threads 1 --mkl_fake_intel
  row mlp1 torch_bf16 -- "$tpy" "$adir/torch2_mlp.py" --world 1 --threads 1 --mkl_fake_intel --amp bf16
  for t in 1 2; do
    kr=("$keel" bench resnet --batch_size=32 --bench_steps=20 --bench_warmup=3 --cpu_math_threads=$t)
    row resnet$t keel_f32 -- "${kr[@]}"
    row resnet$t keel_o1 -- "${kr[@]}" --amp=bf16
    row resnet$t keel_o2 -- "${kr[@]}" --amp=bf16 --amp_level=O2
    tr=("$tpy" "$adir/torch2_models.py" --model resnet --threads $t --steps 20 --mkl_fake_intel)
    row resnet$t torch_f32 -- "${tr[@]}"
    row resnet$t torch_bf16 -- "${tr[@]}" --amp bf16
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    bench, system, js = line.split(" ", 2)
    rows.setdefault(bench, {}).setdefault(system, []).append(json.loads(js)["step_ms"])
for bench, systems in rows.items():
    med = {s: statistics.median(v) for s, v in systems.items()}
    summary = {"bench": bench, "rounds": len(systems["keel_f32"]),
               "step_ms": {s: round(m, 3) for s, m in med.items()}}
    for lvl in ("o1", "o2"):
        k = med.get("keel_" + lvl)
        if k is None:
            continue
        summary[lvl + "_over_keel_f32"] = round(k / med["keel_f32"], 3)
        if "torch_bf16" in med:
            summary[lvl + "_over_torch_bf16"] = round(k / med["torch_bf16"], 3)
    print(json.dumps(summary))
PY
