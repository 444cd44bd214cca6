#!/usr/bin/env bash
# compute-sanitizer racecheck and memcheck on the bf16 DeepSeek-V3 fixture's captured step
# graphs (issue 19 item 7): `mla_tile` + `mla_combine`, the grouped experts, the router and
# the chained bookkeeping kernels, through tests/gpu_deepseek.rs `bf16_methods_are_exact`
# (draft_model and an EAGLE-3 tree, B = 1 and 4). Binaries: scripts/gpu-pack gpu_deepseek.
# Usage on the device: RACE_S=280 bash scripts/device/sanitize_mla.sh
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
find .gpu2 -name '*.gz' -exec gunzip -kf {} \;
chmod +x .gpu2/tests/* 2>/dev/null
s() { # tool, timeout, test binary, test filter
  echo "== $1: $3 $4"
  timeout "$2" compute-sanitizer --tool "$1" --print-limit 5 ".gpu2/tests/$3" --test-threads=1 --nocapture "$4" \
    > "$OUT/sanitize_$1_$3.log" 2>&1
  echo "rc=$?"
  grep -v uploading "$OUT/sanitize_$1_$3.log" \
    | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|hazard|test result|panicked|exact" | tail -8
}
s racecheck "${RACE_S:-280}" gpu_deepseek bf16_methods_are_exact
s memcheck "${MEM_S:-100}" gpu_deepseek bf16_methods_are_exact
