#!/usr/bin/env bash
# Session 39, call C: session 38's unrun call C — the deferred catch-up's long plain
# stretches (gpu_serve long_plain), checked where plain decoding alone on the device
# equals the interpreter, and the forced variants; then the 8B soak at 3000 requests from
# 32 clients (issue 21 item 8). Pack: scripts/gpu-pack --specc gpu_serve.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 240 .gpu2/tests/gpu_serve --test-threads=1 --nocapture long_plain forced_variants \
  > /tmp/serve.log 2>&1
echo "gpu_serve long_plain + forced_variants rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|catch-up|checked|first_difference|lanes" /tmp/serve.log \
  | cut -c1-300 | head -40 >> "$S"
cp /tmp/serve.log "$OUT/serve.log"
REQUESTS=3000 SOAK_S=260 bash scripts/device/serve_soak_8b.sh > /tmp/soak.log 2>&1
echo "8B soak rc=$? ($((SECONDS - start))s)" >> "$S"
tail -12 /tmp/soak.log | cut -c1-200 >> "$S"
echo "total $((SECONDS - start))s" >> "$S"
