#!/usr/bin/env bash
# The grouped MoE expert kernels on the H200 (issues 19, 20): correctness against the
# interpreter (bf16, int4 on CUDA cores and on tensor cores, fp8 stacks), batch invariance
# and GB/s at Kimi's shapes (`BANDWIDTH kimi int4g32 mma` = the tensor-core path), then the
# Kimi-K2 (bf16) and Kimi-K2.5 (int4) benches per kernel. Binaries from
# `scripts/gpu-pack --specc kernels-gen/gpu_quant_moe gpu_quant gpu_deepseek`.
# `sanitize`: racecheck and memcheck over the tensor-core int4 kernels' interpreter test.
# Usage: bash scripts/device/moe_bandwidth.sh [checks] [bench] [sanitize]  (default: checks bench)
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
parts=${*:-checks bench}
for p in $parts; do
  case $p in
    checks)
      bash scripts/device/suite.sh gpu_quant_moe gpu_quant gpu_deepseek
      grep -h "BANDWIDTH\|bit-identical\|token 0" "$OUT/gpu_quant_moe.log" ;;
    bench)
      [[ -x .gpu2/specc ]] || { gunzip -kf .gpu2/specc.gz && chmod +x .gpu2/specc; }
      for cfg in kimi-k2 kimi-k2-int4; do
        K=(.gpu2/specc bench "bench/configs/$cfg/config.json" --random-weights --layers 2 --iters 20)
        echo "== $cfg decode"; timeout 200 "${K[@]}" --per-kernel 2>&1 | grep -vE "uploading" | tee "$OUT/bench_${cfg}_decode.log" | grep -iE "moe|median|roofline|experts|copy" | head -20
        for t in 8 16; do
          echo "== $cfg verify T=$t"; timeout 200 "${K[@]}" --tokens "$t" 2>&1 | grep -vE "uploading" | tail -6
        done
      done ;;
    sanitize)
      find .gpu2 -name '*.gz' -exec gunzip -kf {} \; ; chmod +x .gpu2/tests/* 2>/dev/null
      for tool in racecheck memcheck; do
        echo "== $tool: gpu_quant_moe int4_tensor_core_experts_match_interpreter"
        timeout 240 compute-sanitizer --tool "$tool" --print-limit 5 .gpu2/tests/gpu_quant_moe \
          --test-threads=1 --nocapture int4_tensor_core_experts_match_interpreter 2>&1 \
          | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|hazard|test result|panicked" | tail -6
      done ;;
  esac
done
