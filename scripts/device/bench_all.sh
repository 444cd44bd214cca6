#!/usr/bin/env bash
# One device call: the issue-5 table (specc vs PyTorch in the same process tree), the PDL A/B,
# and the EAGLE-3 k = 7 step with its per-kernel breakdown. After scripts/gpu-build.
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache TORCHINDUCTOR_CACHE_DIR=/tmp/inductor PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
C=bench/configs
B=".gpu/specc bench $C/llama-3.1-8b/config.json --random-weights --iters 60"
echo "== suite + compare (decode, verify 8, batch 8, ctx 8192, 8B + 1B-shaped draft k = 7)"
timeout 380 $B --suite --compare --spec $C/draft-1b-k7.toml --torch-modes eager,graph,compile-layers --json "$OUT/suite.json" > "$OUT/suite.log" 2>&1
echo "rc=$?"; grep -v "^W1\|^\s*$\|uploading" "$OUT/suite.log" | tail -45
echo "== PDL on: decode"
SPECC_PDL=1 timeout 80 $B --json "$OUT/decode_pdl.json" 2>&1 | grep -v "uploading\|^\s*$" | tail -6
echo "== EAGLE-3 k = 7 step, per kernel"
timeout 110 $B --spec $C/eagle3-k7.toml --per-kernel --json "$OUT/eagle3_k7.json" > "$OUT/eagle3.log" 2>&1
echo "rc=$?"; grep -v "uploading" "$OUT/eagle3.log" | grep -iE "step|phase|draft|verify|bookkeeping|PDL|roofline|family|gemv|attn" | head -40
