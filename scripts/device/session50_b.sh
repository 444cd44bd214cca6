#!/usr/bin/env bash
# Session 50, call B (any card): the CUDA calibration with live lanes (variants timed with
# every lane at context 256, states zeroed afterwards). 1. gpu_serve's forced-variant
# exactness for EAGLE-3 chain / tree and DFlash and draft_model's lazy priming, each session
# calibrated first; 2. the calibrated times of the planted 8B engine (SPECC_POLICY_TRACE) and
# issue 22 item 5's sweep at P = 0.3, c = 16, adaptive against plain.
# Pack: .gpu2/specc.xz and .gpu2/tests/gpu_serve.gz.
set -uo pipefail
BUDGET=${BUDGET:-420}
source scripts/device/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
OUT=$OUT bash scripts/device/suite.sh gpu_serve:forced_variants_are_exact gpu_serve:lazily > /tmp/suite.txt 2>&1
grep -E "^==|rc=|PASS|FAIL|panicked|test result" /tmp/suite.txt | head -24 >> "$S"
echo "suite $((SECONDS - start))s" >> "$S"
# Issue 20: the Kimi-K2.5 int4 decode at 6 layers ran at 72.4 % of its roofline (call A; 87.1 %
# at 2 layers): its per-kernel table.
kimi 6 --per-kernel
# On an H200, the one-row GEMV variants at decode B = 1 (issue 22: >= 85 % of the roofline;
# the H100 settled both, 3.4 % and 1 % slower there).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  ab SPECC_GEMV_ONE_ROW=cuda "--batch 1"
  ab SPECC_GEMV_UNROLL=4 "--batch 1"
fi
SPECC_POLICY_TRACE=1 sweep_8b 0.3 16 32 150 30
grep -h "calibrate" /tmp/specc-serve-logs/* 2>/dev/null | head -24 >> "$S"
echo "total $((SECONDS - start))s" >> "$S"
