#!/usr/bin/env bash
# Prepared in session 47 for the next device call (H200 wanted): the wgmma main loop with
# hoisted descriptors (`SPECC_WGMMA_HOIST=1`: descriptors made once per block from a
# warp-uniform warpgroup index, the ring's stage and phase stepped; in the SASS the first
# HGMMA follows the full-stage wait by ~20 uniform-datapath instructions instead of ~40 with
# R2UR chains).
# 1. correctness: every variant (clusters, split gate/up, persistent) with and without the
#    hoisted loop bitwise equal to the chosen tile; the 8B epilogues with it;
#    and the K split's reduce-scatter (every split against the f64 reference, twice bitwise);
# 2. whole 8B verify(8) at B = 16 / 32 with SPECC_WGMMA_SPLIT_K=1 (now a reduce-scatter:
#    each SM receives (S − 1) / S² of a tile instead of block 0 receiving (S − 1) / S)
#    against the default, alternating; at B = 32 / 64: SPECC_WGMMA_HOIST=1 against the default,
#    alternating; then the GEMV's units in flight on the H200 (SPECC_GEMV_UNROLL 2 / 4 at
#    decode B = 1), which the H100 settled (session 47 call D) and the H200 never measured.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-420}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
G=.gpu2/tests/gpu_gemm
timeout 150 $G --test-threads=1 --nocapture --exact gemm_wgmma_clusters_equal_the_unclustered_tile > "$OUT/clusters.log" 2>&1
echo "clusters_equal (with hoisted variants) rc=$? passes=$(grep -c ^PASS "$OUT/clusters.log") ($((SECONDS - start))s)" >> "$S"
grep -E "panicked" -A3 "$OUT/clusters.log" | head -5 >> "$S"
SPECC_WGMMA_HOIST=1 timeout 100 $G --test-threads=1 --nocapture --exact gemm_wgmma_8b_shapes_every_epilogue > "$OUT/epi.log" 2>&1
echo "8b epilogues, hoisted rc=$? passes=$(grep -c ^PASS "$OUT/epi.log")" >> "$S"
timeout 60 $G --test-threads=1 --nocapture --exact gemm_wgmma_split_k_every_split > "$OUT/split.log" 2>&1
echo "split_k_every_split (reduce-scatter) rc=$? passes=$(grep -c ^PASS "$OUT/split.log")" >> "$S"
grep -E "panicked" -A3 "$OUT/split.log" | head -5 >> "$S"
T=bench/configs/llama-3.1-8b/config.json
for b in 16 32; do
  for sk in "" 1 "" 1; do
    (( $(left) > 150 )) || break
    r=$(SPECC_WGMMA_SPLIT_K=$sk timeout 40 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 \
      --batch $b --tokens 8 2>&1 | grep -E "^\| verify|rror" | head -2 | cut -c1-110 | tr '\n' ' ')
    echo "B=$b SPLIT_K=${sk:-default}: $r" >> "$S"
  done
done
for b in 32 64; do
  for h in "" 1 "" 1; do
    (( $(left) > 90 )) || break
    r=$(SPECC_WGMMA_HOIST=$h timeout 40 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 \
      --batch $b --tokens 8 2>&1 | grep -E "^\| verify|rror" | head -2 | cut -c1-110 | tr '\n' ' ')
    echo "B=$b HOIST=${h:-default}: $r" >> "$S"
  done
done
for u in "" 4 "" 4; do
  (( $(left) > 25 )) || break
  r=$(SPECC_GEMV_UNROLL=$u timeout 40 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 \
    --batch 1 2>&1 | grep -E "^\| decode|rror" | head -2 | cut -c1-110 | tr '\n' ' ')
  echo "decode B=1 unroll=${u:-default}: $r" >> "$S"
done
echo "total $((SECONDS - start))s" >> "$S"
