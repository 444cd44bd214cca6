#!/usr/bin/env bash
# Session 50, call D (short, any card): the grouped MoE matmuls load the used count and their
# slot's expert together (two dependent loads before the weights instead of three). The
# grouped kernels against the interpreter, then the Kimi-K2.5 int4 6-layer decode and
# verify(8) before (specc_base: call C's build) and after, alternating, then kimi_bandwidth.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_quant_moe (specc as xz) + specc_base.xz.
set -uo pipefail
BUDGET=${BUDGET:-220}
source scripts/device/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
OUT=$OUT bash scripts/device/suite.sh gpu_quant_moe:experts_match_interpreter > /tmp/suite.txt 2>&1
grep -E "^==|rc=|panicked|test result" /tmp/suite.txt | head -8 >> "$S"
kimi_ab 6 40 specc_base specc
if (( $(left) > 60 )); then
  SPECC_KIMI_TOKENS=8,1 SPECC_KIMI_VARIANTS=int4g32,g4s4w4-i timeout $(( $(left) - 10 )) \
    .gpu2/tests/gpu_quant_moe --nocapture --test-threads=1 kimi_bandwidth > "$OUT/kimi_bw.log" 2>&1
  echo "kimi_bandwidth rc=$? ($(left)s left)" >> "$S"
  grep -E "BANDWIDTH|bit-identical|panicked" "$OUT/kimi_bw.log" | cut -c1-200 | head -12 >> "$S"
fi
echo "total $((SECONDS - start))s" >> "$S"
