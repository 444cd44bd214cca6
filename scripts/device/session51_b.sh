#!/usr/bin/env bash
# Session 51, call B (any card), call A's pack: 1. the Kimi 6-layer decode with the default
# CUDA-core expert tiling and the pipelined g2d4u2-p (SPECC_MOE_TILING), alternating three
# times (verify(8) runs the tensor-core experts, unaffected); 2. gpu_serve's forced variants
# after the two-context calibration, with its trace lines; 3. the planted 8B sweep at
# P = 0.6, c = 1 (issue 22: ≥ 2×), adaptive with context slopes.
set -uo pipefail
BUDGET=${BUDGET:-480}
source scripts/device/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
for round in 1 2 3; do
  for t in g2d4u2 g2d4u2-p; do
    (( $(left) > 300 )) || break
    r=$(SPECC_MOE_TILING=$t timeout 60 .gpu2/specc bench $KIMI --random-weights --layers 6 \
      --iters 30 --context 1024 2>&1 | grep -E "^\| decode|rror" | head -1 | cut -c1-110)
    echo "kimi l6 $t: $r" >> "$S"
  done
done
SPECC_POLICY_TRACE=1 OUT=$OUT timeout 120 bash scripts/device/suite.sh gpu_serve:forced_variants \
  > /tmp/suite2.txt 2>&1
grep -E "^==|rc=|panicked|test result" /tmp/suite2.txt | head -6 >> "$S"
grep -h "calibrate" "$OUT"/gpu_serve.log | head -12 | cut -c1-170 >> "$S"
echo "($(left)s left)" >> "$S"
sweep_8b 0.6 1 16 150 15
echo "total $((SECONDS - start))s" >> "$S"
