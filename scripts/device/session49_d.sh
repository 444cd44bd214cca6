#!/usr/bin/env bash
# Session 49, call D (whatever card comes): session49_a.sh (the slot-warp decode tiles'
# parity and their A/Bs) within 300 s, then Kimi-K2.5 int4 at 2 layers and the most this card
# holds (per-kernel verify(8)).
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_attn (specc as xz).
set -uo pipefail
source scripts/device/lib.sh
BUDGET=300 bash scripts/device/session49_a.sh
kimi_layers
echo "total $((SECONDS - start))s" >> "$S"
