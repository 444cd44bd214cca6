#!/usr/bin/env bash
# Session 50, call C (any card): moe_combine split over blocks of a token's row, every pair's
# value loaded before the first add (issue 20: the Kimi-K2.5 int4 decode at 6 layers ran at
# 72.4 % of its roofline with the grouped experts at 1.5 TB/s). 1. the grouped kernels
# against the interpreter (bf16, int4 CUDA cores and tensor cores, fp8; batch invariance);
# 2. kimi_bandwidth at T = 16, 8, 1 (CUDA cores and g4s4w4-i): all four kernels against
# gate/up and down alone; 3. the Kimi 6-layer decode and verify(8), before (specc_base) and
# after, alternating; 4. gpu_deepseek's method exactness on the MoE fixtures.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_quant_moe gpu_deepseek (specc as xz), and
# the previous specc as .gpu2/specc_base.xz.
set -uo pipefail
BUDGET=${BUDGET:-480}
source scripts/device/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
OUT=$OUT bash scripts/device/suite.sh gpu_quant_moe:grouped_experts_match_interpreter > /tmp/suite.txt 2>&1
grep -E "^==|rc=|panicked|test result" /tmp/suite.txt | head -8 >> "$S"
SPECC_KIMI_TOKENS=16,8,1 SPECC_KIMI_VARIANTS=int4g32,g4s4w4-i timeout 150 \
  .gpu2/tests/gpu_quant_moe --nocapture --test-threads=1 kimi_bandwidth > "$OUT/kimi_bw.log" 2>&1
echo "kimi_bandwidth rc=$? ($(left)s left)" >> "$S"
grep -E "BANDWIDTH|bit-identical|panicked" "$OUT/kimi_bw.log" | cut -c1-200 | head -24 >> "$S"
kimi_ab 6 60 specc_base specc
if (( $(left) > 120 )); then
  OUT=$OUT timeout $(( $(left) - 30 )) bash scripts/device/suite.sh \
    gpu_deepseek:methods_are_exact_at_full_and_partial_acceptance gpu_deepseek:decode_matches_cpu > /tmp/suite2.txt 2>&1
  grep -E "^==|rc=|PASS|FAIL|panicked|test result" /tmp/suite2.txt | head -12 >> "$S"
fi
echo "total $((SECONDS - start))s" >> "$S"
