#!/usr/bin/env bash
# Session 35, call A: where the int4 grouped expert kernels lose their bandwidth (Nsight
# Compute over the CUDA-core and g4s4w4 kernels at Kimi's shapes, T = 1 and 8: speed of
# light, memory, warp stall reasons, occupancy), then issue 22's batch figures against
# PyTorch (decode B = 1, 64; verify(8) B = 32, 64) and the planted 8B serving at c = 1
# (the last-step read).
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_quant_moe
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-540}
left() { echo $((BUDGET - (SECONDS - start))); }
bin=.gpu2/tests/gpu_quant_moe
stalls='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
# The hottest SASS lines of a report by warp-stall samples, with the stall columns.
hot() {
  ncu --import "$1" --page source --csv --print-source sass 2>/dev/null > "$1.src.csv"
  python3 - "$1.src.csv" <<'PY'
import csv, sys
rows, head, kern = [], None, "?"
for r in csv.reader(open(sys.argv[1], errors="replace")):
    if not r: continue
    if head is None or ("Source" in r and "Address" in r[0:3]):
        if "Source" in r: head = r; continue
        kern = r[0][:60]; continue
    if len(r) != len(head): kern = r[0][:60]; continue
    d = dict(zip(head, r))
    key = next((k for k in head if k.startswith("Warp Stall Sampling (All")), None)
    if key is None: continue
    try: n = float(d[key].replace(",", ""))
    except ValueError: continue
    rows.append((n, kern, d.get("Source", "")[:70], {k: d[k] for k in head if k.startswith("stall_") or "Stall" in k and k != key}))
tot = sum(r[0] for r in rows) or 1
for n, k, src, st in sorted(rows, reverse=True)[:14]:
    top = sorted(((float(v.replace(",", "") or 0), c) for c, v in st.items() if v.replace(",", "").replace(".", "").isdigit()), reverse=True)[:3]
    print(f"{100*n/tot:5.1f}% {src:70s} {top}")
PY
}
for T in 1 8; do
  for V in int4g32 g4s4w4; do
    f="$OUT/ncu_${V}_T$T"
    SPECC_KIMI_TOKENS=$T SPECC_KIMI_VARIANTS=$V timeout 150 ncu --clock-control none \
      -k 'regex:moe_(gate_up|down)' --launch-count 2 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section LaunchStats --section SourceCounters --metrics "$stalls" \
      -o "$f" -f "$bin" --test-threads=1 --nocapture kimi_bandwidth > "$f.log" 2>&1
    echo "== ncu $V T=$T rc=$? ($(left)s left)"
    grep -E "^BANDWIDTH kimi" "$f.log" | cut -c1-200
    ncu --import "$f.ncu-rep" --page details > "$f.txt" 2>&1
    ncu --import "$f.ncu-rep" --page raw --csv --metrics "$stalls" > "$f.stalls.csv" 2>&1
    grep -E "^  moe_|Duration|DRAM Throughput|Memory Throughput|L2 Hit|L1/TEX Hit|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Ipc|No Eligible|Active Warps Per" "$f.txt" \
      | sed -E 's/ +/ /g' | cut -c1-110
    python3 - "$f.stalls.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if r]
hi = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if hi is not None:
    head = rows[hi]
    for r in rows[hi + 1:]:
        if len(r) != len(head) or not r[head.index("Kernel Name")].startswith("moe"): continue
        vals = []
        for c, v in zip(head, r):
            if "stalled" in c:
                try: vals.append((float(v.replace(",", "")), c.split("stalled_")[1].split("_per")[0]))
                except ValueError: pass
        vals.sort(reverse=True)
        print(r[head.index("Kernel Name")][:40], " ".join(f"{n}={x:.2f}" for x, n in vals[:8]))
PY
    [[ $T == 1 ]] && hot "$f.ncu-rep" 2>&1 | head -30
  done
done
T8=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 1" "--batch 1 --tokens 8"; do
  f="$OUT/perkernel_b1_$(echo $spec | tr -cd 0-9).txt"
  echo "== 8B $spec ($(left)s left)"
  timeout 60 .gpu2/specc bench $T8 --random-weights --iters 40 --context 1024 $spec --per-kernel > "$f" 2>&1
  grep -E "^\| [a-z]" "$f" | head -24 | cut -c1-150
done
for spec in "--batch 32 --tokens 8" "--batch 64 --tokens 8" "--batch 64"; do
  (( $(left) > 150 )) || break
  echo "== 8B $spec ($(left)s left)"
  timeout 110 .gpu2/specc bench $T8 --random-weights --iters 40 --context 1024 $spec \
    --compare --torch-modes compile-layers 2>&1 | grep -E "^\| [a-z]|torch|error" | tail -8
done
if (( $(left) > 90 )); then
  LANES=16 MAX_CONTEXT=2048 REQUESTS=16 TOKENS=64 ACCEPT="0.6" CONC=1 \
    timeout $(( $(left) - 5 )) bash scripts/device/serve_sweep_accept.sh 8b 2>&1 | tail -5
fi
echo "total $((SECONDS - start))s"
