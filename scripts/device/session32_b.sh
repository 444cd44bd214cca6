#!/usr/bin/env bash
# Session 32, second call: admissions at the smallest batch bucket holding their lanes
# (gpu_serve: every priming path through one-lane windows, shadows of the per-lane knobs,
# joint windows under shrinking), then the 8B planted sweep of session 31 again (16 lanes,
# ctx 2048, 16 requests x 64 tokens; plain vs draft_model k = 7 at P = 0.3 / 0.6 / 0.9).
# and the 8B soak with what time is left (scripts/device/serve_soak_8b.sh).
# The wgmma GEMM's kernel checks (gpu_gemm gemm_wgmma) come right after gpu_serve.
# Pack: scripts/gpu-pack --specc gpu_serve kernels-gen/gpu_gemm
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-585}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh gpu_serve
grep -h "prefill graphs captured\|replays\|shrinking" "$OUT/gpu_serve.log" | head -12
echo "== wgmma checks ($(left)s left)"
timeout 150 .gpu2/tests/gpu_gemm --test-threads=1 --nocapture gemm_wgmma > "$OUT/wgmma_checks.log" 2>&1
echo "checks rc=$?"; grep -E "row invariance|SKIP|panicked|test result|FAIL" "$OUT/wgmma_checks.log" | tail -12
echo "PASS lines: $(grep -c '^PASS ' "$OUT/wgmma_checks.log")"
echo "== 8B sweep ($(left)s left)"
LANES=16 MAX_CONTEXT=2048 REQUESTS=${REQUESTS:-16} TOKENS=${TOKENS:-64} \
  timeout $(( $(left) - 10 )) bash scripts/device/serve_sweep_accept.sh 8b 2>&1 | grep -v uploading | tail -40
if (( $(left) > 150 )); then
  echo "== 8B soak ($(left)s left)"
  SOAK_S=$(( $(left) - 10 )) bash scripts/device/serve_soak_8b.sh
fi
mkdir -p /tmp/rest; find "$OUT" -maxdepth 1 -type f ! -name 'sweep_8b*' ! -name gpu_serve.log ! -name wgmma_checks.log ! -name serve_soak_8b.txt -exec mv {} /tmp/rest/ \;
ls "$OUT"
