#!/usr/bin/env bash
# Session 45, call D: whole 8B verify(8) steps (ctx 1024) at B = 32 / 16 with 64-row wgmma
# tiles for one matrix of at most 8192 columns up to 256 rows (default) against 128-row
# tiles above 64 rows (SPECC_WGMMA_BM64_ROWS=64), alternating. Pack: scripts/gpu-pack --specc.
set -uo pipefail
source scripts/device/unpack.sh
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
T=bench/configs/llama-3.1-8b/config.json
for b in 32 16 32; do
  for r in "" 64; do
    echo "== 8B verify(8) B=$b SPECC_WGMMA_BM64_ROWS=${r:-default}" >> "$S"
    SPECC_WGMMA_BM64_ROWS=$r timeout 40 .gpu2/specc bench $T --random-weights --iters 40 \
      --context 1024 --batch $b --tokens 8 > /tmp/v.txt 2>&1
    grep -E "^\| verify|rror" /tmp/v.txt | cut -c1-200 >> "$S"
  done
done
