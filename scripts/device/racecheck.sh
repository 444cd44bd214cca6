#!/usr/bin/env bash
# Its own device call (slow: the trained DDTree test under racecheck takes more than 150 s):
# compute-sanitizer racecheck on the captured DDTree step graphs, random drafter (f32 fixtures)
# and trained family (bf16: the tree verifies run the x-staged matmuls, mbarrier + bulk copies).
# After scripts/gpu-build. Usage on the device: bash scripts/device/racecheck.sh
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
for which in random trained; do
  echo "== racecheck: $which DDTree step graphs"
  timeout 280 compute-sanitizer --tool racecheck --print-limit 5 .gpu/tests/gpu_ddtree \
    --test-threads=1 "${which}_ddtree_is_exact" 2>&1 | grep -v uploading | tail -4
done
