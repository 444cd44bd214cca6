#!/usr/bin/env bash
# Its own device call (slow: the full trained DDTree test under racecheck took more than 300 s; this runs its
# quick subset):
# compute-sanitizer racecheck on the captured DDTree step graphs of the trained family (bf16:
# the tree verifies run the x-staged matmuls, mbarrier + bulk copies, and the 4-warp tree
# attention blocks), then, if asked with `random`, the random drafter's (f32 fixtures: CUDA-core
# kernels only). After scripts/gpu-build. Usage on the device: bash scripts/device/racecheck.sh [random]
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
# One many-row budget (64 at B = 4), 16 tokens: tests/gpu_ddtree.rs's quick subset.
export SPECC_GPU_QUICK=1
for which in trained ${1:-}; do
  echo "== racecheck: $which DDTree step graphs"
  timeout 540 compute-sanitizer --tool racecheck --print-limit 5 .gpu/tests/gpu_ddtree \
    --test-threads=1 "${which}_ddtree_is_exact" 2>&1 | grep -v uploading | tail -4
done
