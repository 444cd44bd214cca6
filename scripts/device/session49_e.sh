#!/usr/bin/env bash
# Session 49, call E (H200 wanted; short): issue 22's 8B table with the current defaults, each
# step against compiled PyTorch layers in the same run, the figures the issue names first.
# Pack: scripts/gpu-pack --specc (specc as xz).
set -uo pipefail
BUDGET=${BUDGET:-240}
source scripts/device/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
table_8b "--batch 32 --tokens 8" "--batch 32" "--batch 64 --tokens 8" "--batch 64" \
  "--batch 8 --tokens 8" "--batch 8" "--batch 1" "--batch 1 --tokens 8"
echo "total $((SECONDS - start))s" >> "$S"
