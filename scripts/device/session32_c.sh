#!/usr/bin/env bash
# Session 32, last call: admissions through lane windows with one arena per prefill plan
# (gpu_serve), the 8B soak at concurrency 32 (exactness under load, no leak), the 8B planted
# sweep at P = 0.6 / 0.9 again (plain from the previous call), then the int4 expert tilings'
# bandwidth table while time is left.
# Pack: scripts/gpu-pack --specc gpu_serve kernels-gen/gpu_quant_moe
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-330}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh gpu_serve
grep -h "prefill graphs captured\|replays\|shrinking" "$OUT/gpu_serve.log" | head -8
echo "== 8B soak ($(left)s left)"
REQUESTS=1200 SOAK_S=120 bash scripts/device/serve_soak_8b.sh
echo "== 8B sweep P = 0.6 / 0.9 ($(left)s left)"
LANES=16 MAX_CONTEXT=2048 REQUESTS=16 TOKENS=64 ACCEPT="0.6 0.9" SKIP_PLAIN=1 \
  timeout $(( $(left) - 10 )) bash scripts/device/serve_sweep_accept.sh 8b 2>&1 | grep -v uploading | grep -E "^\||^ +[0-9]|== sweep" | tail -14
if (( $(left) > 100 )); then
  echo "== int4 tilings ($(left)s left)"
  timeout $(( $(left) - 5 )) .gpu2/tests/gpu_quant_moe --test-threads=1 --nocapture kimi_bandwidth > "$OUT/gpu_quant_moe.log" 2>&1
  echo "rc=$?"; grep -E "panicked|outside tolerance|differ" "$OUT/gpu_quant_moe.log" | head -5
  grep -A12 "^BANDWIDTH TABLE" "$OUT/gpu_quant_moe.log"
fi
mkdir -p /tmp/rest; find "$OUT" -maxdepth 1 -type f ! -name 'sweep_8b_p*' ! -name gpu_serve.log ! -name serve_soak_8b.txt ! -name gpu_quant_moe.log -exec mv {} /tmp/rest/ \;
ls "$OUT"
