#!/usr/bin/env bash
# Session 37, call C: the generic cases with the scalar head_matmul back, then the acceptance
# estimator learnt as shrunk evidence counts on the device: `gpu_serve` (every method's
# admissions equal their lone tokens), serving the 8B shape with a random-weight EAGLE-3 head
# (zero acceptance, the worst case) at c = 1, 4, 16 with the previous build and this one,
# plain decoding beside them, and the planted P = 0.3 / 0.6 draft_model sweep at c = 1 and
# 16. Output to $OUT/summary.txt as it runs.
# Pack: scripts/gpu-pack --specc gpu_serve kernels-gen/gpu_generic, the previous build's specc
# as .gpu2/specc_base.gz.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 60 .gpu2/tests/gpu_generic --test-threads=1 --nocapture > "$OUT/generic.log" 2>&1
echo "gpu_generic rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" "$OUT/generic.log" | head -5 >> "$S"
grep -E "head_matmul" "$OUT/generic.log" | head -12 | cut -c1-140 >> "$S"
timeout 120 .gpu2/tests/gpu_serve --test-threads=1 > "$OUT/serve.log" 2>&1
echo "gpu_serve rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" "$OUT/serve.log" | head -5 >> "$S"
export CONC=1,4,16 REQUESTS=32
TAG=new_ bash scripts/device/serve_sweep_8b.sh none eagle3-k7 >> "$S" 2>&1
echo "new done $((SECONDS - start))s" >> "$S"
SPECC_BIN=.gpu2/specc_base TAG=base_ bash scripts/device/serve_sweep_8b.sh eagle3-k7 >> "$S" 2>&1
echo "base done $((SECONDS - start))s" >> "$S"
if (( $(left) > 150 )); then
  CONC=1,16 REQUESTS=16 TOKENS=128 LANES=16 MAX_CONTEXT=2048 ACCEPT="0.3 0.6" \
    timeout $(( $(left) - 10 )) bash scripts/device/serve_sweep_accept.sh 8b >> "$S" 2>&1
fi
echo "total $((SECONDS - start))s" >> "$S"
