#!/usr/bin/env bash
# Session 37, call D (call C's sweeps again: their output did not come back): the acceptance
# estimator learnt as shrunk evidence counts, serving the 8B shape with a random-weight
# EAGLE-3 head (zero acceptance, the worst case) at c = 1, 4, 16 with the previous build and
# this one, plain decoding beside them; the planted P = 0.3 / 0.6 draft_model sweep at c = 1
# and 16 with 128-token requests, and P = 0.6 at c = 1 with 64-token requests (session 36's
# setting). Everything is written under /tmp/s37; the summary and the JSON results are
# copied to $OUT at the end (at most 8 files come back).
# Pack: scripts/gpu-pack --specc, the previous build's specc as .gpu2/specc_base.gz.
set -uo pipefail
REAL_OUT=$OUT
export OUT=/tmp/s37; mkdir -p "$OUT"
source scripts/device/unpack.sh
start=$SECONDS
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
export CONC=1,4,16 REQUESTS=32
TAG=new_ bash scripts/device/serve_sweep_8b.sh none eagle3-k7 >> "$S" 2>&1
echo "new done $((SECONDS - start))s" >> "$S"
SPECC_BIN=.gpu2/specc_base TAG=base_ bash scripts/device/serve_sweep_8b.sh eagle3-k7 >> "$S" 2>&1
echo "base done $((SECONDS - start))s" >> "$S"
CONC=1,16 REQUESTS=16 TOKENS=128 LANES=16 MAX_CONTEXT=2048 ACCEPT="0.3 0.6" \
  timeout 240 bash scripts/device/serve_sweep_accept.sh 8b >> "$S" 2>&1
echo "planted 128 done $((SECONDS - start))s" >> "$S"
OUT=/tmp/s37/t64 CONC=1 REQUESTS=16 TOKENS=64 LANES=16 MAX_CONTEXT=2048 ACCEPT="0.6" \
  timeout 150 bash scripts/device/serve_sweep_accept.sh 8b >> "$S" 2>&1
echo "total $((SECONDS - start))s" >> "$S"
cp "$S" "$OUT"/sweep_8b.md "$REAL_OUT"/ 2>/dev/null
cp /tmp/s37/t64/sweep_8b.md "$REAL_OUT"/sweep_8b_t64.md 2>/dev/null
tar czf "$REAL_OUT"/json.tgz -C /tmp/s37 $(cd /tmp/s37 && ls *.json t64/*.json 2>/dev/null)
