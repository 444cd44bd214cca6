#!/usr/bin/env bash
# Session 50, call A (any card): on an H200 first issue 22's 8B table with today's defaults
# against compiled PyTorch layers (the H200 table is still session 47's); then issue 20's
# Kimi-K2.5 int4 step at 2 layers and at the most this card holds (12 on an H200, 6 on an
# H100) with per-kernel verify(8), and issue 22's planted P = 0.6 sweep at c = 1.
# Pack: scripts/gpu-pack --specc (specc as xz).
set -uo pipefail
BUDGET=${BUDGET:-560}
source scripts/device/lib.sh
card=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$card" >> "$S"
if [[ $card == *H200* ]]; then
  table_8b "--batch 32 --tokens 8" "--batch 32" "--batch 64 --tokens 8" "--batch 64" \
    "--batch 8 --tokens 8" "--batch 8" "--batch 1" "--batch 1 --tokens 8"
  echo "8b table $((SECONDS - start))s" >> "$S"
fi
kimi_layers
echo "kimi $((SECONDS - start))s" >> "$S"
sweep_8b 0.6 1 16
echo "total $((SECONDS - start))s" >> "$S"
