#!/usr/bin/env bash
# Session 46, call E: persistent wgmma launches (one block or cluster of 2 per SM, the ring
# running on across tiles, the next tile's copies under the epilogue).
# 1. correctness: every cluster shape, the split gate/up, one block per tile and persistent
#    on 132 and on 3 blocks (clusters) bitwise equal to the chosen tile; row invariance;
# 2. whole 8B verify(8) at B = 32 / 64 (ctx 1024): default (persistent) against
#    SPECC_WGMMA_PERSISTENT=0, alternating;
# 3. issue 22's rows at B = 32 / 64 against compiled PyTorch layers, with whichever of the two
#    was faster at B = 32, then the Kimi-K2.5 int4 decode and verify(8) at ctx 1024 (issue 20).
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-480}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
G=.gpu2/tests/gpu_gemm
for t in gemm_wgmma_clusters_equal_the_unclustered_tile gemm_wgmma_rows_do_not_depend_on_the_batch; do
  timeout 170 $G --test-threads=1 --nocapture --exact $t > "$OUT/$t.log" 2>&1
  echo "$t rc=$? passes=$(grep -c ^PASS "$OUT/$t.log") ($((SECONDS - start))s)" >> "$S"
  grep -E "panicked" -A3 "$OUT/$t.log" | head -5 >> "$S"
  grep -E "persistent_blocks: 3" "$OUT/$t.log" | grep -v " 0 of " | head -3 >> "$S"
done
T=bench/configs/llama-3.1-8b/config.json
declare -A sum
for b in 32 64; do
  for pe in "" 0 "" 0; do
    echo "== 8B verify(8) B=$b SPECC_WGMMA_PERSISTENT=${pe:-default} ($(left)s left)" >> "$S"
    SPECC_WGMMA_PERSISTENT=$pe timeout 40 .gpu2/specc bench $T --random-weights --iters 40 \
      --context 1024 --batch $b --tokens 8 > /tmp/v.txt 2>&1
    line=$(grep -E "^\| verify" /tmp/v.txt | cut -c1-200); echo "$line" >> "$S"
    grep -E "rror" /tmp/v.txt | head -3 >> "$S"
    ms=$(echo "$line" | awk -F'|' '{print $6}')
    [[ $b == 32 ]] && sum[${pe:-on}]=$(awk -v a="${sum[${pe:-on}]:-0}" -v b="${ms:-99}" 'BEGIN { print a + b }')
  done
done
PE=""; awk -v off="${sum[0]:-99}" -v on="${sum[on]:-99}" 'BEGIN { exit !(off < on) }' && PE=0
echo "table with SPECC_WGMMA_PERSISTENT=${PE:-default} (B=32 sums: on ${sum[on]:-?}, off ${sum[0]:-?})" >> "$S"
export SPECC_WGMMA_PERSISTENT=$PE
for spec in "--batch 32 --tokens 8" "--batch 64 --tokens 8"; do
  (( $(left) > 110 )) || break
  echo "== 8B $spec ($(left)s left)" >> "$S"
  timeout 60 .gpu2/specc bench $T --random-weights --iters 40 \
    --context 1024 $spec --compare --torch-modes graph,compile-layers > /tmp/b.txt 2>&1
  grep -E "^\||rror" /tmp/b.txt | grep -v "^|---" | cut -c1-220 | tail -3 >> "$S"
  cp /tmp/b.txt "$OUT/8b_${spec// /_}.txt"
done
K=bench/configs/kimi-k2-int4/config.json
for spec in "" "--tokens 8"; do
  (( $(left) > 45 )) || break
  echo "== kimi int4 2 layers ctx 1024 $spec ($(left)s left)" >> "$S"
  timeout $(( $(left) - 5 )) .gpu2/specc bench $K --random-weights --layers 2 --iters 30 --context 1024 $spec \
    > /tmp/k.txt 2>&1
  grep -E "^\||roofline|experts|rror" /tmp/k.txt | grep -v "^|---" | cut -c1-220 | tail -6 >> "$S"
done
echo "total $((SECONDS - start))s" >> "$S"
