#!/usr/bin/env bash
# Session 46, call F: issue 22's verify(8) rows at B = 32 and 64 (ctx 1024) with the final
# selection, each against compiled PyTorch layers under a graph in the same run.
# Pack: scripts/gpu-pack --specc (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
T=bench/configs/llama-3.1-8b/config.json
for b in 32 64; do
  timeout 58 .gpu2/specc bench $T --random-weights --iters 30 --context 1024 --batch $b \
    --tokens 8 --compare --torch-modes compile-layers > /tmp/b.txt 2>&1
  grep -E "^\||rror" /tmp/b.txt | grep -v "^|---" | cut -c1-200 | tail -3 >> "$S"
done
