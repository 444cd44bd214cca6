#!/usr/bin/env bash
# Session 40, call H (the last of the session's device time): the overlapped MLA schedule's
# parity and bucket invariance against the interpreter, its tile / combine times and the
# 32-split rows of the sweep (its 2-stage rows are the sequential schedule in the same
# build). Pack: gpu_parity_mla of the mla-overlap build in .gpu3/tests (carry .gpu3).
set -uo pipefail
rm -rf .gpu2 && mv .gpu3 .gpu2
source scripts/device/unpack.sh
start=$SECONDS
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 60 .gpu2/tests/gpu_parity_mla --test-threads=1 --nocapture > /tmp/parity_mla.log 2>&1
echo "gpu_parity_mla rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL|mismatch" /tmp/parity_mla.log | head -8 | cut -c1-200 >> "$S"
echo "PASS lines: $(grep -cE "PASS" /tmp/parity_mla.log)" >> "$S"
cp /tmp/parity_mla.log "$OUT/"
timeout 30 .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "kimi B|panicked" >> "$S"
timeout 40 .gpu2/tests/gpu_parity_mla mla_tile_split_sweep --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "SWEEP.*splits 32|panicked" >> "$S"
echo "total $((SECONDS - start))s" >> "$S"
