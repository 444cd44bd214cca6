#!/usr/bin/env bash
# Session 35, call A: where the int4 grouped expert kernels lose their bandwidth (Nsight
# Compute over the CUDA-core and g4s4w4 kernels at Kimi's shapes, T = 1 and 8: speed of
# light, memory, warp stall reasons, occupancy), then issue 22's batch figures against
# PyTorch (decode B = 1, 64; verify(8) B = 32, 64) and the planted 8B serving at c = 1
# (the last-step read).
# Pack: scripts/gpu-pack --specc gpu_serve kernels-gen/gpu_quant_moe
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-540}
left() { echo $((BUDGET - (SECONDS - start))); }
bin=.gpu2/tests/gpu_quant_moe
bash scripts/device/suite.sh gpu_serve 2>&1 | grep -vE "^test .* ok$" | tail -8
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
timeout 120 "$bin" --test-threads=1 --nocapture int4_tensor_core_experts_match_interpreter \
  > "$OUT/int4_parity.log" 2>&1
echo "int4 parity rc=$?"; grep -E "panicked|outside|differ|test result" "$OUT/int4_parity.log" | head -5
SPECC_KIMI_VARIANTS=int4g32,g4s4w4,g4s4w4-x,g4s4w4-i,g4s4w4-ix,g8s4w4-ix timeout 200 "$bin" \
  --test-threads=1 --nocapture kimi_bandwidth > "$OUT/kimi_bw.log" 2>&1
echo "kimi_bandwidth rc=$? ($(left)s left)"
grep -E "panicked|PASS" "$OUT/kimi_bw.log" | cut -c1-160; grep -A10 "^BANDWIDTH TABLE" "$OUT/kimi_bw.log"
for run in g4s4w4:1 g4s4w4-ix:1; do
  V=${run%%:*}; T=${run#*:}
  (( $(left) > 330 )) || break
  {
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
  }
done
T=bench/configs/llama-3.1-8b/config.json
S=.gpu2/specc
python3 -c '
import json, random
r = random.Random(7)
for i in range(16):
    n = 3000 if i % 4 == 3 else 64
    print(json.dumps({"prompt": [r.randrange(1000, 100000) for _ in range(n)]}))
' > /tmp/long.jsonl
printf 'method = "none"\nbatch_buckets = [1, 4, 16]\n' > /tmp/none.toml
port=$((8100 + RANDOM % 500))
$S serve $T --random-weights --backend cuda --lanes 16 --max-context 4096 --port $port \
  --spec /tmp/none.toml --shrink-buckets --prefill-chunk 512 > "$OUT/serve_long_512.log" 2>&1 &
pid=$!
for i in $(seq 1 150); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 1; done
echo "== long prompts, 512-row budget (ready after ${i}s, $(left)s left)"
grep -i "prefill" "$OUT/serve_long_512.log" | head -2 | cut -c1-200
timeout 100 $S bench-serve --url "http://127.0.0.1:$port" --concurrency 16 --requests 32 \
  --max-tokens 64 --ignore-eos --prompts /tmp/long.jsonl --json "$OUT/long_512.json" 2>&1 | tail -4
kill $pid; wait $pid 2>/dev/null
if (( $(left) > 150 )); then
  CONC=16 REQUESTS=32 timeout $(( $(left) - 5 )) bash scripts/device/serve_sweep_8b.sh eagle3-k7 dflash-b16 2>&1 | grep -vE "uploading" | tail -12
fi
T8=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 1" "--batch 1 --tokens 8"; do
  (( $(left) > 100 )) || break
  f="$OUT/perkernel_b1_$(echo $spec | tr -cd 0-9).txt"
  echo "== 8B $spec ($(left)s left)"
  timeout 60 .gpu2/specc bench $T8 --random-weights --iters 40 --context 1024 $spec --per-kernel > "$f" 2>&1
  grep -E "^\| [a-z]" "$f" | head -24 | cut -c1-150
done
for spec in ${TORCH_SPECS:-}; do
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
