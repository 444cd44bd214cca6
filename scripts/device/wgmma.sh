#!/usr/bin/env bash
# The sm_90a wgmma GEMM (`gemm_wgmma`) on the device, one mode per call (each within the
# 10-minute limit):
#   bash scripts/device/wgmma.sh check     parity with the CPU reference at every epilogue and
#                                          shape, and row invariance
#   bash scripts/device/wgmma.sh time      the wgmma | gemm_mma | gemv_mma table at
#                                          M = 32..1024 that sets choose::gemm's thresholds,
#                                          then the wgmma tile sweep (chosen vs other tiles)
#   bash scripts/device/wgmma.sh sanitize  the odd-shape checks under compute-sanitizer memcheck
# Pack first: scripts/gpu-pack kernels-gen/gpu_gemm; run with carry=[".gpu2"].
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
find .gpu2 -name '*.gz' -exec gunzip -kf {} \;
chmod +x .gpu2/tests/* 2>/dev/null
bin=.gpu2/tests/gpu_gemm
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case ${1:-check} in
  check)
    timeout 560 "$bin" --test-threads=1 --nocapture gemm_wgmma > "$OUT/wgmma_checks.log" 2>&1
    echo "checks rc=$?"
    grep -E "max \|err\||row invariance|SKIP|panicked|test result" "$OUT/wgmma_checks.log" \
      | grep -vE "^PASS |max \|err\|" | tail -30
    echo "PASS lines: $(grep -c '^PASS ' "$OUT/wgmma_checks.log")"
    grep -E "max \|err\|" "$OUT/wgmma_checks.log" | sort -t'|' -k3 -g | tail -5 ;;
  time)
    timeout 330 "$bin" --test-threads=1 --nocapture --ignored --exact time_wgmma_vs_gemm_vs_gemv_mma \
      > "$OUT/wgmma_time.log" 2>&1
    echo "timing rc=$?"
    grep -vE "^(running|test |$)" "$OUT/wgmma_time.log" | tail -50
    timeout 225 "$bin" --test-threads=1 --nocapture --ignored --exact time_wgmma_tiles \
      > "$OUT/wgmma_tiles.log" 2>&1
    echo "tile sweep rc=$?"
    grep -E "^tiles|panicked" "$OUT/wgmma_tiles.log" | tail -20 ;;
  sanitize)
    timeout 560 /usr/local/cuda/bin/compute-sanitizer --tool memcheck "$bin" --test-threads=1 \
      --nocapture gemm_wgmma_odd_shapes > "$OUT/wgmma_memcheck.log" 2>&1
    echo "memcheck rc=$?"
    grep -E "ERROR SUMMARY|Invalid|panicked|test result" "$OUT/wgmma_memcheck.log" | tail -20 ;;
  *) echo "usage: wgmma.sh check|time|sanitize"; exit 2 ;;
esac
