#!/usr/bin/env bash
# One device call: issue 6's figures with the default launch path (PDL off), all in one process
# tree so they compare: decode, verify of T = 8 / 32 / 64 tokens, the DDTree step at budgets
# 16–256 and the DFlash block-16 step (Llama-3.1-8B target shapes, random bf16 weights, B = 1,
# ctx 1024), then memcheck on the trained DDTree / DFlash step graphs with their printed
# verdicts. After scripts/gpu-build. Usage on the device: bash scripts/device/issue6_rows.sh
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
C=bench/configs
B=".gpu/specc bench $C/llama-3.1-8b/config.json --random-weights --iters 50 --batch 1 --context 1024"
row() { echo "## $*"; timeout 90 $B "$@" 2>&1 | grep -v "uploading\|^\s*$" | tail -7; }
row
for t in 8 32 64; do row --tokens $t; done
for b in 16 32 64 128 256; do row --spec $C/ddtree-b$b.toml; done
row --spec $C/dflash-b16.toml
export SPECC_GPU_QUICK=1
for t in gpu_ddtree:trained_ddtree_is_exact gpu_dflash:trained_dflash_is_exact; do
  echo "== memcheck ${t%%:*} ${t##*:}"
  timeout 90 compute-sanitizer --tool memcheck --print-limit 5 ".gpu/tests/${t%%:*}" --test-threads=1 --nocapture "${t##*:}" 2>&1 \
    | grep -E "ERROR SUMMARY|exact|test result|panicked" | tail -4
done
