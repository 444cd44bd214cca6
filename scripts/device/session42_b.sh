#!/usr/bin/env bash
# Session 42, call B (warm after A): compute-sanitizer racecheck and memcheck of the
# clustered `mla_wgmma` (small Kimi-K2 cases: one cluster spanning 1024 slots, two clusters
# at 2048) and of the engine test; an Nsight Compute profile of the B = 8 decode launch
# pair at ctx 8192; the Kimi-K2.5 int4 verify of 8 tokens at ctx 1024 (issue 20).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-300}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
for tool in racecheck memcheck; do
  timeout 100 compute-sanitizer --tool $tool --print-limit 5 .gpu2/tests/gpu_parity_mla \
    mla_small_cases --ignored --test-threads=1 --nocapture > /tmp/san_$tool.log 2>&1
  echo "$tool gpu_parity_mla mla_small_cases rc=$? ($((SECONDS - start))s)" >> "$S"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|test result|PASS" /tmp/san_$tool.log | head -6 | cut -c1-200 >> "$S"
  cp /tmp/san_$tool.log "$OUT/"
done
(( $(left) > 90 )) && timeout 70 compute-sanitizer --tool memcheck --print-limit 5 .gpu2/tests/gpu_deepseek \
  mla_wgmma_dims --test-threads=1 --nocapture 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 >> "$S"
if (( $(left) > 60 )); then
  SPECC_MLA_CASES=8x1 timeout 60 ncu --clock-control none -k 'regex:mla_(wgmma|combine)' --launch-count 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy \
    .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 > "$OUT/ncu.txt" 2>&1
  echo "ncu rc=$? ($((SECONDS - start))s)" >> "$S"
fi
if (( $(left) > 30 )); then
  echo "== Kimi-K2.5 int4 2 layers ctx 1024 T=8" >> "$S"
  timeout 40 .gpu2/specc bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30 \
    --context 1024 --tokens 8 > /tmp/v8.txt 2>&1
  grep -E "^\| (decode|verify)|roofline|experts" /tmp/v8.txt | head -6 | cut -c1-200 >> "$S"
  cp /tmp/v8.txt "$OUT/"
fi
echo "total $((SECONDS - start))s" >> "$S"
