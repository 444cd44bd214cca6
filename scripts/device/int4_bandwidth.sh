#!/usr/bin/env bash
# Issue 20 on the H200: the tensor-core int4 expert tilings (`Int4MmaTiling::VARIANTS`).
# 1. Every tiling against the interpreter at small shapes (T = 1..16, batch invariance), and
#    the CUDA-core, bf16 and fp8 grouped kernels as before (`gpu_quant_moe`, all tests).
# 2. `kimi_bandwidth`: at Kimi's shapes (7168 × 2048, top-8 of 64 experts) bf16, int4 on CUDA
#    cores and int4 in every tiling: token 0 vs an f64 reference, T = 8..1 bit-identical to
#    T = 16, then the time of the four kernels (and gate/up, down alone); the `BANDWIDTH
#    TABLE` of % of copy bandwidth per variant and T is printed last.
# 3. `sanitize` (optional): racecheck + memcheck over the tensor-core interpreter test.
# Binaries: `scripts/gpu-pack kernels-gen/gpu_quant_moe`.
# Usage: bash scripts/device/int4_bandwidth.sh [sanitize]
set -uo pipefail
source scripts/device/unpack.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bin=.gpu2/tests/gpu_quant_moe
timeout 540 "$bin" --test-threads=1 --nocapture > "$OUT/gpu_quant_moe.log" 2>&1
echo "gpu_quant_moe rc=$?"
grep -E "^test |PASS|panicked|outside tolerance|differ|SKIP|test result" "$OUT/gpu_quant_moe.log" \
  | grep -v "^test .* ok$" | tail -40
grep -E "^BANDWIDTH kimi" "$OUT/gpu_quant_moe.log" > "$OUT/bandwidth_lines.log"
echo; grep -A12 "^BANDWIDTH TABLE" "$OUT/gpu_quant_moe.log"
if [[ ${1:-} == sanitize ]]; then
  for tool in racecheck memcheck; do
    echo "== $tool: int4_tensor_core_experts_match_interpreter"
    timeout 300 compute-sanitizer --tool "$tool" --print-limit 5 "$bin" --test-threads=1 \
      --nocapture int4_tensor_core_experts_match_interpreter 2>&1 \
      | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|hazard|test result|panicked" | tail -6
  done
fi
