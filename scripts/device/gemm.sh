#!/usr/bin/env bash
# The tiled GEMM (`gemm_mma`) on the device: parity with the CPU reference at every epilogue
# and row invariance first, then the timings against `gemv_mma` (an ignored test).
# Pack first: scripts/gpu-pack kernels-gen/gpu_gemm; run with carry=[".gpu2"].
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
find .gpu2 -name '*.gz' -exec gunzip -kf {} \;
chmod +x .gpu2/tests/* 2>/dev/null
bin=.gpu2/tests/gpu_gemm
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 420 "$bin" --test-threads=1 --nocapture > "$OUT/gpu_gemm.log" 2>&1; echo "checks rc=$?"
grep -E "max \|err\||row invariance|PASS|panicked|test result" "$OUT/gpu_gemm.log" | grep -v "^PASS gemm_mma" | tail -60
timeout 170 "$bin" --test-threads=1 --nocapture --ignored time_ > "$OUT/gpu_gemm_time.log" 2>&1; echo "timing rc=$?"
grep -vE "^(running|test |$)" "$OUT/gpu_gemm_time.log" | tail -40
