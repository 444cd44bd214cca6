#!/usr/bin/env bash
# Session 42, call C (prepared, not run: no machine came): the MLA pair timings at Kimi-K2
# dims; memcheck of the MLA kernels on small Kimi-K2 cases (planned `mla_wgmma`, the opt-in
# cluster fold, the ping-pong, `mla_tile`, each against the interpreter); an Nsight Compute
# profile with stall reasons of the planned B = 8 decode launch at ctx 8192; the Kimi-K2.5
# int4 verify of 8 tokens at ctx 1024 (issue 20) and decode.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-230}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 60 .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "kimi B|panicked" >> "$S"
timeout 80 compute-sanitizer --tool memcheck --print-limit 5 .gpu2/tests/gpu_parity_mla \
  mla_small_cases --ignored --test-threads=1 --nocapture > /tmp/san_memcheck.log 2>&1
echo "memcheck gpu_parity_mla mla_small_cases rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "ERROR SUMMARY|test result|PASS" /tmp/san_memcheck.log | head -8 | cut -c1-200 >> "$S"
SPECC_MLA_CASES=8x1 timeout 70 ncu --clock-control none -k 'regex:mla_wgmma' --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --section SourceCounters --section MemoryWorkloadAnalysis_Tables \
  .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 > "$OUT/ncu_c.txt" 2>&1
echo "ncu rc=$? ($((SECONDS - start))s)" >> "$S"
for spec in "--context 1024 --tokens 8" "--context 1024"; do
  (( $(left) > 25 )) || break
  echo "== Kimi-K2.5 int4 2 layers $spec" >> "$S"
  SPECC_MLA_CLUSTER=0 timeout 40 .gpu2/specc bench bench/configs/kimi-k2-int4/config.json --random-weights \
    --layers 2 --iters 30 $spec --per-kernel > /tmp/v.txt 2>&1
  grep -E "^\| (decode|verify)|union|roofline" /tmp/v.txt | head -5 | cut -c1-200 >> "$S"
  grep -E "^\| mla_attention |rror" /tmp/v.txt | cut -c1-140 | head -2 >> "$S"
  cat /tmp/v.txt >> "$OUT/bench_1024.txt"
done
echo "total $((SECONDS - start))s" >> "$S"
