#!/usr/bin/env bash
# Session 33, first call: the wgmma GEMM timed against gemm_mma / gemv_mma (the table that
# sets choose::gemm's thresholds), whole 8B steps at B = 8 / 32 / 64 with SPECC_WGMMA=0 vs 1
# in the same call, and why P = 0.6 at c = 1 reached 1.43× (the planted k = 7 step's time
# alone, then the server at c = 1 with the adaptive and the fixed policy, traced).
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bin=.gpu2/tests/gpu_gemm
echo "== wgmma | gemm_mma | gemv_mma"
timeout 200 "$bin" --test-threads=1 --nocapture --ignored --exact time_wgmma_vs_gemm_vs_gemv_mma \
  > "$OUT/wgmma_time.log" 2>&1
echo "timing rc=$?"
grep -vE "^(running|test |$)" "$OUT/wgmma_time.log" | tail -48
T=bench/configs/llama-3.1-8b/config.json
B=".gpu2/specc bench $T --random-weights --iters 40 --context 1024"
row() { # label, args...
  local l=$1; shift
  timeout 90 $B "$@" 2>&1 | grep -E "median|step|roofline|wgmma|ms" | head -4 | sed "s/^/$l  /"
}
for spec in "--batch 8" "--batch 8 --tokens 8" "--batch 32" "--batch 32 --tokens 8" "--batch 64 --tokens 8"; do
  (( $(left) > 200 )) || break
  echo "== 8B $spec ($(left)s left)"
  SPECC_WGMMA=0 row "mma  " $spec
  SPECC_WGMMA=1 row "wgmma" $spec
done
echo "== planted k = 7 step, B = 1 ($(left)s left)"
timeout 90 $B --batch 1 --synthetic-acceptance 0.6 --spec bench/configs/draft-tiny-k7.toml 2>&1 | tail -6
timeout 60 $B --batch 1 --tokens 8 2>&1 | tail -3
for pol in adaptive fixed; do
  (( $(left) > 70 )) || break
  echo "== serve c = 1, P = 0.6, $pol ($(left)s left)"
  SPECC_POLICY_TRACE=1 POLICY=$pol LANES=16 MAX_CONTEXT=2048 REQUESTS=8 TOKENS=64 CONC=1 ACCEPT=0.6 SKIP_PLAIN=1 \
    timeout $(( $(left) - 20 )) bash scripts/device/serve_sweep_accept.sh 8b 2>&1 | grep -v uploading | grep -E "^\||^ +[0-9]|== sweep|variant" | tail -8
  mv "$OUT/serve_8b_p0.6.log" "$OUT/trace_$pol.log" 2>/dev/null
  grep -m1 "pick k=" "$OUT/trace_$pol.log"; grep -E "pick k=" "$OUT/trace_$pol.log" | tail -2
  grep -o "pick k=[0-9]*.*" "$OUT/trace_$pol.log" | sort | uniq -c
  python3 - "$OUT/trace_$pol.log" <<'PY'
import re, sys, collections
steps = collections.defaultdict(list)
for l in open(sys.argv[1], errors="replace"):
    m = re.search(r"step bucket=(\d+) k=(\d+) ([\d.]+)ms (\d+)tok .* host ([\d.]+)ms", l)
    if m:
        steps[(int(m[1]), int(m[2]))].append((float(m[3]), int(m[4]), float(m[5])))
for (b, k), v in sorted(steps.items()):
    n = len(v)
    print(f"bucket {b} k={k}: {n} steps, {sum(x[0] for x in v)/n:.2f} ms, "
          f"{sum(x[1] for x in v)/n:.2f} tok, host {sum(x[2] for x in v)/n:.2f} ms")
PY
done
mkdir -p /tmp/rest; find "$OUT" -maxdepth 1 -type f ! -name 'trace_*' ! -name wgmma_time.log ! -name 'sweep_8b_p*.json' -exec mv {} /tmp/rest/ \;
for f in "$OUT"/trace_*.log; do [[ -f $f ]] && { tail -c 2000000 "$f" > "$f.t"; mv "$f.t" "$f"; gzip -f "$f"; }; done
ls -la "$OUT"
