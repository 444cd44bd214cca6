#!/usr/bin/env bash
# Quantised weights (int4 pack-quantized, fp8 block) on the device, one call: the quantised
# GEMV kernel at 1-64 rows and the grouped MoE experts over int4 / fp8 stacks at 1-16 tokens
# vs the interpreter (kernels-gen's gpu_quant_gemv and gpu_quant_moe, NVRTC from the
# device's CUDA), then the int4 / fp8 DeepSeek-V3 fixtures end to end (gpu_quant: logits vs
# HF and the interpreter, plain decoding and draft_model B = 1 and 4), then memcheck over the
# fp8 decode. Build here first:
#   scripts/gpu-pack kernels-gen/gpu_quant_gemv kernels-gen/gpu_quant_moe gpu_quant
# then run(command="bash scripts/device/quant_checks.sh", carry=[".gpu2"]).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bash scripts/device/suite.sh gpu_quant_gemv gpu_quant_moe gpu_quant
echo "== memcheck gpu_quant decode_matches_cpu"
timeout 400 compute-sanitizer --tool memcheck --print-limit 20 \
  .gpu2/tests/gpu_quant --test-threads=1 decode_matches_cpu > "$OUT/memcheck_quant.log" 2>&1
echo "rc=$?"; grep -E "ERROR SUMMARY|test result" "$OUT/memcheck_quant.log" | tail -5
