#!/usr/bin/env bash
# Session 49, call B (H200 wanted): issue 22's 8B table with the current defaults (hoisted
# wgmma descriptors, the combine folded into the attention tiles from two tokens), decode and
# verify(8) at B = 32, 64, 8, 1, 16, ctx 1024, each against compiled PyTorch layers in the
# same run; then session49_a.sh (slot-warp tile parity and the decode A/Bs) with what is left.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_attn (specc as xz).
set -uo pipefail
source scripts/device/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
table_8b "--batch 32 --tokens 8" "--batch 32" "--batch 64 --tokens 8" "--batch 64" "--batch 8" \
  "--batch 8 --tokens 8" "--batch 1" "--batch 1 --tokens 8" "--batch 16" "--batch 16 --tokens 8"
echo "table $((SECONDS - start))s" >> "$S"
BUDGET=$(left) bash scripts/device/session49_a.sh
