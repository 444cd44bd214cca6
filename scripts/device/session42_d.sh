#!/usr/bin/env bash
# Session 42, call D (prepared, not run: the device time was spent): the warpgroups'
# ping-pong against the interpreter and bitwise against the plan on small Kimi-K2 cases,
# bucket invariance, its pair timings beside the plan's (the split sweep at three cases),
# then the Kimi-K2.5 int4 verify of 8 tokens at ctx 1024 (issue 20).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-160}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 40 .gpu2/tests/gpu_parity_mla mla_small_cases mla_tiles_are_bucket_invariant --include-ignored \
  --nocapture --test-threads=1 > /tmp/pp.log 2>&1
echo "small cases + invariance rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL|ping-pong" /tmp/pp.log | head -6 | cut -c1-200 >> "$S"
grep -cE "PASS" /tmp/pp.log >> "$S"; cp /tmp/pp.log "$OUT/"
SPECC_MLA_CASES=1x1,8x1,1x4 timeout 60 .gpu2/tests/gpu_parity_mla mla_tile_split_sweep --ignored \
  --nocapture --test-threads=1 2>&1 | grep -E "SWEEP.*splits  32 mla_wgmma|panicked" >> "$S"
if (( $(left) > 15 )); then
  SPECC_MLA_CLUSTER=0 timeout $(( $(left) )) .gpu2/specc bench bench/configs/kimi-k2-int4/config.json --random-weights \
    --layers 2 --iters 30 --context 1024 --tokens 8 > /tmp/v.txt 2>&1
  grep -E "^\| (decode|verify)|union" /tmp/v.txt | head -4 | cut -c1-200 >> "$S"; cp /tmp/v.txt "$OUT/"
fi
echo "total $((SECONDS - start))s" >> "$S"
