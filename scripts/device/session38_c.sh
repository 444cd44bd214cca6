#!/usr/bin/env bash
# Session 38, call C: the deferred catch-up's long plain stretches on the device with every
# line of their reports (call B: the forced variants passed, the 100-token stretches
# failed at the interpreter check), now also checked against plain decoding alone on the
# device. Pack: scripts/gpu-pack gpu_serve.
set -uo pipefail
source scripts/device/unpack.sh
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 200 .gpu2/tests/gpu_serve --test-threads=1 --nocapture long_plain forced_variants \
  > /tmp/serve.log 2>&1
echo "gpu_serve rc=$?" >> "$S"
grep -E "test result|panicked|PASS|FAIL|note" /tmp/serve.log | cut -c1-400 | head -40 >> "$S"
