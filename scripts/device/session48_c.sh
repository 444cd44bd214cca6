#!/usr/bin/env bash
# Session 48, call C: issue 22's 8B table again with the session's defaults (hoisted wgmma descriptors,
# the combine folded into the attention tiles from two tokens): decode and verify(8) at B = 32,
# 64, 8, 1, ctx 1024, each against compiled PyTorch layers under a graph in the same run.
# Then the wgmma GEMM from 64 rows, one-warp attention tiles of 32 slots, and on an H200 the one-row A/Bs. Output in $OUT/summary.txt.
# Pack: scripts/gpu-pack --specc (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
T=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 32 --tokens 8" "--batch 32" "--batch 64 --tokens 8" "--batch 64" \
  "--batch 8" "--batch 8 --tokens 8" "--batch 1" "--batch 1 --tokens 8"; do
  (( $(left) > 45 )) || break
  echo "== 8B $spec ($(left)s left)" >> "$S"
  timeout $(( $(left) > 70 ? 60 : $(left) - 10 )) .gpu2/specc bench $T --random-weights --iters 40 \
    --context 1024 $spec --compare --torch-modes graph,compile-layers > /tmp/b.txt 2>&1
  grep -E "^\||torch|rror" /tmp/b.txt | grep -v "^|---" | cut -c1-220 | tail -8 >> "$S"
  cp /tmp/b.txt "$OUT/8b_${spec// /_}.txt"
done
# The wgmma GEMM (now with hoisted descriptors) from 64 rows: verify(8) B = 8.
for x in "SPECC_NONE=1" "SPECC_WGMMA_MIN_ROWS=64" "SPECC_NONE=1" "SPECC_WGMMA_MIN_ROWS=64"; do
  (( $(left) > 20 )) || break
  r=$(env "$x" timeout 30 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 \
    --batch 8 --tokens 8 2>&1 | grep -E "^\| verify|rror" | head -2 | cut -c1-110 | tr '\n' ' ')
  echo "verify(8) B=8 $x: $r" >> "$S"
done
# One-warp attention tiles (decode) of 32 slots instead of 64 (SPECC_ATTN_ONE_WARP_SLOTS=32:
# 39 KB a block instead of 74, five blocks a SM instead of three), decode B = 32 and 1.
for b in 32 1; do
  for x in "SPECC_NONE=1" "SPECC_ATTN_ONE_WARP_SLOTS=32" "SPECC_NONE=1" "SPECC_ATTN_ONE_WARP_SLOTS=32"; do
    (( $(left) > 20 )) || break
    r=$(env "$x" timeout 30 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 \
      --batch $b 2>&1 | grep -E "^\| decode|rror" | head -2 | cut -c1-110 | tr '\n' ' ')
    echo "decode B=$b $x: $r" >> "$S"
  done
done
# On an H200 only (the H100 settled both in call A): one-row matmuls on CUDA cores, and 4 GEMV
# units in flight, against the default at decode B = 1.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  for v in "SPECC_GEMV_ONE_ROW=cuda" "SPECC_GEMV_UNROLL=4"; do
    for x in "SPECC_NONE=1" "$v" "SPECC_NONE=1" "$v"; do
      (( $(left) > 20 )) || break
      r=$(env "$x" timeout 30 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 \
        --batch 1 2>&1 | grep -E "^\| decode|rror" | head -2 | cut -c1-110 | tr '\n' ' ')
      echo "decode B=1 $x: $r" >> "$S"
    done
  done
fi
echo "total $((SECONDS - start))s" >> "$S"
