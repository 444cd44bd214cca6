#!/usr/bin/env bash
# Benchmarks on the device (Llama-3.1-8B shapes, random bf16 weights): decode, verify of 8
# tokens, speculative steps (1B-shaped draft, EAGLE-3 head; k = 7), batch 8, context 8192.
# Tables go to stdout and $OUT/bench.md; JSON next to them.
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
C=bench/configs
B=".gpu/specc bench $C/llama-3.1-8b/config.json --random-weights --iters 60"
run() { echo "## $*" | tee -a "$OUT/bench.md"; timeout 150 "$@" 2>&1 | grep -v "^\s*$" | tee -a "$OUT/bench.md"; }
run $B --batch 1 --context 1024 --per-kernel --json "$OUT/decode_b1_c1024.json"
# A/B of programmatic dependent launch (the report's "PDL ..." line says which).
SPECC_PDL=1 run $B --batch 1 --context 1024 --json "$OUT/decode_b1_c1024_pdl.json"
run $B --batch 1 --context 1024 --tokens 8 --json "$OUT/verify8_b1_c1024.json"
run $B --batch 1 --context 1024 --spec $C/draft-1b-k7.toml --json "$OUT/draft1b_k7.json"
run $B --batch 1 --context 1024 --spec $C/eagle3-k7.toml --json "$OUT/eagle3_k7.json"
run $B --batch 8 --context 1024 --json "$OUT/decode_b8_c1024.json"
run $B --batch 1 --context 8192 --json "$OUT/decode_b1_c8192.json"
