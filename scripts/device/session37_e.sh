#!/usr/bin/env bash
# Session 37, call E: Nsight Compute on `mla_tile` at Kimi-K2 dims, ctx 8192, B = 1, T = 1
# (speed of light, warp states, the hottest instructions: what a split's tiles wait on), then
# the 8B batch steps against PyTorch in the same call (issue 22: decode B = 32 / 64 and
# verify(8) B = 32 were last measured in session 33). Output to $OUT/summary.txt as it runs.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-460}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}" >> "$S"
if [[ -n $NCU ]]; then
  timeout 150 "$NCU" --clock-control none --kernel-name regex:mla_tile --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section SourceCounters \
    .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 \
    > /tmp/ncu_mla.txt 2>&1
  echo "ncu rc=$? ($((SECONDS - start))s)" >> "$S"
  grep -vE "^\s*$|^==PROF==|^kimi B" /tmp/ncu_mla.txt | cut -c1-160 | head -150 > "$OUT/ncu_mla.txt"
fi
T=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 32" "--batch 32 --tokens 8" "--batch 64"; do
  (( $(left) > 100 )) || break
  echo "== 8B $spec ($(left)s left)" >> "$S"
  timeout $(( $(left) - 10 )) .gpu2/specc bench $T --random-weights --iters 40 --context 1024 $spec \
    --compare --torch-modes graph,compile-layers 2>&1 | grep -E "^\||torch|error" | grep -v "^|---" \
    | cut -c1-200 | tail -8 >> "$S"
done
echo "total $((SECONDS - start))s" >> "$S"
