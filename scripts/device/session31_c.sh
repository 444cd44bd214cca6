#!/usr/bin/env bash
# One device call (session 31): serving through captured last-row prefills (gpu_serve,
# gpu_e2e), the 8B planted-acceptance concurrency sweep (plain vs draft_model k = 7 with the
# 2-layer draft at P = 0.3 / 0.6 / 0.9, 16 lanes, ctx 2048), then gpu_deepseek and gpu_sampling
# while the call has time left (BUDGET seconds, default 540).
# Pack: scripts/gpu-pack --specc gpu_serve gpu_e2e gpu_deepseek gpu_sampling
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-540}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh gpu_serve gpu_e2e
grep -h "prefill graphs captured\|replays" "$OUT/gpu_serve.log" | head -4
echo "== 8B sweep ($(left)s left)"
LANES=16 MAX_CONTEXT=2048 REQUESTS=${REQUESTS:-16} TOKENS=${TOKENS:-64} \
  timeout $(( $(left) - 90 )) bash scripts/device/serve_sweep_accept.sh 8b 2>&1 | grep -v uploading | tail -40
for b in gpu_deepseek gpu_sampling; do
  (( $(left) < 70 )) && { echo "skip $b: $(left)s left"; continue; }
  OUT=$OUT timeout $(( $(left) - 5 )) bash scripts/device/suite.sh $b
done
# Only a few files come back from a call: keep the sweep's table, plot and JSON.
mkdir -p /tmp/rest; find "$OUT" -maxdepth 1 -type f ! -name 'sweep_8b*' -exec mv {} /tmp/rest/ \;
ls "$OUT"
