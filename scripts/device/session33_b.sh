#!/usr/bin/env bash
# Session 33, second call: the blocked `sample` kernel against the interpreter (gpu_generic
# sample cases, gpu_sampling), chunked admissions on every method (gpu_serve), then the
# planted 8B sweep at P = 0.6 with the new sample kernel (the serving engine's k = 7 step
# was 10.3 ms against 5.78 ms for the greedy engine), then the whole-step wgmma A/B.
# Pack: scripts/gpu-pack --specc gpu_serve gpu_sampling kernels-gen/gpu_generic
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-540}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh gpu_generic:sample gpu_sampling gpu_serve
grep -h "^PASS.*chunk\|FAIL" "$OUT/gpu_serve.log" | head -12
echo "== 8B sweep P = 0.6 ($(left)s left)"
SPECC_POLICY_TRACE=1 LANES=16 MAX_CONTEXT=2048 REQUESTS=16 TOKENS=64 ACCEPT=0.6 SKIP_PLAIN=1 \
  timeout $(( $(left) - 120 )) bash scripts/device/serve_sweep_accept.sh 8b 2>&1 | grep -v uploading | grep -E "^\||^ +[0-9]|== sweep" | tail -8
grep -m1 "pick k=" "$OUT/serve_8b_p0.6.log"; grep -o "pick k=[0-9]*" "$OUT/serve_8b_p0.6.log" | sort | uniq -c
T=bench/configs/llama-3.1-8b/config.json
B=".gpu2/specc bench $T --random-weights --iters 40 --context 1024"
for spec in "--batch 32 --tokens 8" "--batch 32" "--batch 8 --tokens 8"; do
  (( $(left) > 45 )) || break
  echo "== 8B $spec ($(left)s left)"
  for w in 0 1; do SPECC_WGMMA=$w timeout 60 $B $spec 2>&1 | grep -E "^\| [a-z]" | sed "s/^/wgmma=$w /"; done
done
mkdir -p /tmp/rest; find "$OUT" -maxdepth 1 -type f ! -name 'gpu_*.log' ! -name 'sweep_8b_p*.json' -exec mv {} /tmp/rest/ \;
ls -la "$OUT"
