#!/usr/bin/env bash
# Prepared in session 48 for the next device call (H200 wanted):
# 1. gpu_parity_attn: the tile cases incl. decode blocks whose 4 (or 2) warps split each
#    tile's slots and merge their softmax states (`TileTiling::slot_warps`, never run on a
#    device), each also with the combine folded in;
# 2. decode B = 1 / 32 / 64 with SPECC_ATTN_SLOT_WARPS=4 and with 32-slot one-warp tiles
#    (SPECC_ATTN_ONE_WARP_SLOTS=32) against the default, alternating;
# 3. on an H200: one-row matmuls on CUDA cores and 4 GEMV units in flight at decode B = 1
#    (the H100 settled both: 3.4 % and 1 % slower there);
# 4. the wgmma GEMM from 64 rows (SPECC_WGMMA_MIN_ROWS=64) at verify(8) B = 8.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_attn (specc as xz).
set -uo pipefail
BUDGET=${BUDGET:-420}
source scripts/device/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 150 .gpu2/tests/gpu_parity_attn --test-threads=1 --nocapture attention_tile > "$OUT/attn.log" 2>&1
echo "gpu_parity_attn attention_tile* rc=$? fused passes=$(grep -c '^PASS fused' "$OUT/attn.log") ($((SECONDS - start))s)" >> "$S"
grep -E "panicked|test result" -A2 "$OUT/attn.log" | head -6 >> "$S"
for b in 32 1 64; do ab SPECC_ATTN_SLOT_WARPS=4 "--batch $b"; done
for b in 32 1; do ab SPECC_ATTN_ONE_WARP_SLOTS=32 "--batch $b"; done
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  ab SPECC_GEMV_ONE_ROW=cuda "--batch 1"
  ab SPECC_GEMV_UNROLL=4 "--batch 1"
fi
ab SPECC_WGMMA_MIN_ROWS=64 "--batch 8 --tokens 8"
echo "total $((SECONDS - start))s" >> "$S"
