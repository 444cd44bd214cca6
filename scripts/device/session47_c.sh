#!/usr/bin/env bash
# Session 47, call C (H200): gemm_wgmma's K split over a cluster.
# 1. correctness: every split (1, 2, 4) against the f64 reference and run twice bitwise equal;
#    the 8B epilogues with the chosen tiles; rows invariant for a given split; clusters equal;
# 2. whole 8B verify(8) at B = 16 / 32 / 64 (ctx 1024): default (split) against
#    SPECC_WGMMA_SPLIT_K=0, alternating;
# 3. decode B = 32 / 64 with the wgmma GEMM from 32 rows (SPECC_WGMMA_MIN_ROWS=32) against
#    the default (gemv_mma below 128 rows), alternating;
# 4. verify(8) B = 32 against compiled PyTorch layers in the same call, and its per-kernel table.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-480}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
G=.gpu2/tests/gpu_gemm
gtest() {
  timeout $1 $G --test-threads=1 --nocapture --exact $2 > "$OUT/$2.log" 2>&1
  echo "$2 rc=$? passes=$(grep -c ^PASS "$OUT/$2.log") ($((SECONDS - start))s)" >> "$S"
  grep -E "panicked" -A3 "$OUT/$2.log" | head -6 >> "$S"
}
gtest 100 gemm_wgmma_split_k_every_split
T=bench/configs/llama-3.1-8b/config.json
for b in 32 16 64; do
  for sk in "" 0 "" 0; do
    (( $(left) > 300 )) || break
    SPECC_WGMMA_SPLIT_K=$sk timeout 40 .gpu2/specc bench $T --random-weights --iters 40 \
      --context 1024 --batch $b --tokens 8 > /tmp/v.txt 2>&1
    line=$(grep -E "^\| verify" /tmp/v.txt | cut -c1-120)
    echo "B=$b SPLIT_K=${sk:-default}: $line" >> "$S"
    grep -E "rror" /tmp/v.txt | head -3 >> "$S"
  done
done
for b in 32 64; do
  for mr in "" 32 "" 32; do
    (( $(left) > 230 )) || break
    SPECC_WGMMA_MIN_ROWS=$mr timeout 40 .gpu2/specc bench $T --random-weights --iters 40 \
      --context 1024 --batch $b > /tmp/v.txt 2>&1
    line=$(grep -E "^\| decode" /tmp/v.txt | cut -c1-120)
    echo "decode B=$b WGMMA_MIN_ROWS=${mr:-default}: $line" >> "$S"
    grep -E "rror" /tmp/v.txt | head -3 >> "$S"
  done
done
(( $(left) > 200 )) && gtest 90 gemm_wgmma_8b_shapes_every_epilogue
(( $(left) > 150 )) && gtest 60 gemm_wgmma_rows_do_not_depend_on_the_batch
(( $(left) > 120 )) && {
  SPECC_GEMM_SPLIT_K=2 timeout 60 $G --test-threads=1 --nocapture --exact gemm_wgmma_rows_do_not_depend_on_the_batch > "$OUT/rows_split2.log" 2>&1
  echo "rows invariance, split 2: rc=$? passes=$(grep -c ^PASS "$OUT/rows_split2.log")" >> "$S"; }
(( $(left) > 75 )) && {
  timeout 70 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 --batch 32 --tokens 8 \
    --compare --torch-modes compile-layers > "$OUT/cmp32.txt" 2>&1
  grep -E "^\| verify|rror" "$OUT/cmp32.txt" | tail -2 >> "$S"; }
(( $(left) > 40 )) && {
  timeout 60 .gpu2/specc bench $T --random-weights --iters 30 --context 1024 --batch 32 --tokens 8 \
    --per-kernel > "$OUT/pk32.txt" 2>&1; echo "per-kernel rc=$?" >> "$S"; }
(( $(left) > 35 )) && {
  timeout $(( $(left) - 5 )) .gpu2/specc bench bench/configs/kimi-k2-int4/config.json --random-weights \
    --layers 2 --iters 30 --context 1024 --tokens 8 --per-kernel > "$OUT/kimi_pk8.txt" 2>&1
  echo "kimi verify(8) per-kernel rc=$?" >> "$S"
  grep -E "^\| verify" "$OUT/kimi_pk8.txt" | head -1 >> "$S"; }
echo "total $((SECONDS - start))s" >> "$S"
