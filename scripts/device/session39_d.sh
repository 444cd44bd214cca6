#!/usr/bin/env bash
# Session 39, call D: gpu_deepseek (the DeepSeek-V3 engines against HF and exact through
# every method, with q_a|kv_a stacked; call B's 120 s were too few), then the register-fed
# tensor-core GEMV at up to 8 rows with 2 units in flight a warp instead of 4 (call B's
# sweep: 10-19 % faster at Kimi's o, down and dense MLP shapes) against the same build
# with 4, in one call: Kimi-K2.5 int4 verify(8) / decode, Llama-3.1-8B verify(8) / decode.
# Pack: gpu_deepseek; HEAD's specc as specc_base, the unroll-2 build as specc (xz -9e).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 220 .gpu2/tests/gpu_deepseek --test-threads=1 > /tmp/deepseek.log 2>&1
echo "gpu_deepseek rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "^test |test result|panicked|FAIL" /tmp/deepseek.log | cut -c1-200 | head -16 >> "$S"
KI="bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30"
E8="bench/configs/llama-3.1-8b/config.json --random-weights --iters 30"
for args in "$KI --tokens 8" "$E8 --tokens 8" "$KI" "$E8"; do
  for bin in specc_base specc; do
    (( SECONDS - start < ${BUDGET:-420} )) || break 2
    echo "$bin $args: $(timeout 40 .gpu2/$bin bench $args 2>&1 | grep -E '^\| (decode|verify)' | head -1 | cut -c1-110)" >> "$S"
  done
done
echo "total $((SECONDS - start))s" >> "$S"
