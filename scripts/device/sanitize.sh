#!/usr/bin/env bash
# One device call: compute-sanitizer racecheck and memcheck on the captured DDTree and DFlash
# step graphs of the trained family (bf16: the tree verifies run the x-staged matmuls with
# mbarrier + bulk copies and the 4-warp tree attention blocks), through the quick subsets of
# tests/gpu_ddtree.rs and tests/gpu_dflash.rs (`SPECC_GPU_QUICK=1`: B = 4, 16 tokens, DDTree
# budget 64). After scripts/gpu-build. Usage on the device: bash scripts/device/sanitize.sh
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache SPECC_GPU_QUICK=1
s() { # tool, timeout, test binary, test filter
  echo "== $1: $3 $4"
  timeout "$2" compute-sanitizer --tool "$1" --print-limit 5 ".gpu/tests/$3" --test-threads=1 --nocapture "$4" 2>&1 \
    | grep -v uploading | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|hazard|test result|panicked|exact" | tail -6
  echo "rc=${PIPESTATUS[0]}"
}
s racecheck 300 gpu_ddtree trained_ddtree_is_exact
s racecheck 150 gpu_dflash trained_dflash_is_exact
s memcheck 70 gpu_ddtree trained_ddtree_is_exact
s memcheck 70 gpu_dflash trained_dflash_is_exact
