#!/usr/bin/env bash
# Session 42, call A: `mla_wgmma` with its splits folded in thread-block clusters (DSMEM):
# parity and bucket invariance of every MLA kernel (clustered, unfolded, `mla_tile`) against
# the interpreter, their tile / combine times at Kimi-K2 dims, the engine test at the dims it
# takes (draft_model exact at capacity 256 and 2048), the Kimi-K2.5 int4 steps with the fold
# and without it (`SPECC_MLA_CLUSTER=0`) in the same call, racecheck of small cases, an
# Nsight Compute profile of the B = 8 decode pair, then the split × cluster sweep.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla gpu_deepseek (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-480}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 200 .gpu2/tests/gpu_parity_mla --test-threads=1 --nocapture > /tmp/parity_mla.log 2>&1
echo "gpu_parity_mla rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL|mismatch" /tmp/parity_mla.log | head -8 | cut -c1-300 >> "$S"
echo "PASS lines: $(grep -cE "PASS" /tmp/parity_mla.log)" >> "$S"
cp /tmp/parity_mla.log "$OUT/"
timeout 60 .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "kimi B|panicked" >> "$S"
timeout 150 .gpu2/tests/gpu_deepseek mla_wgmma_dims --test-threads=1 --nocapture > /tmp/ds.log 2>&1
echo "gpu_deepseek mla_wgmma_dims rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "exact|test result|panicked" /tmp/ds.log | cut -c1-300 | head -8 >> "$S"
cp /tmp/ds.log "$OUT/"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for spec in "--context 8192" "--context 8192 --tokens 4" "--context 8192 --batch 8"; do
  for flag in 0 1; do
    (( $(left) > 60 )) || break
    echo "== Kimi-K2.5 int4 2 layers $spec SPECC_MLA_CLUSTER=$flag ($(left)s left)" >> "$S"
    SPECC_MLA_CLUSTER=$flag timeout 60 .gpu2/specc "${KI[@]}" $spec --per-kernel > /tmp/k.txt 2>&1
    grep -E "^\| (decode|verify)" /tmp/k.txt | head -1 | cut -c1-150 >> "$S"
    grep -E "^\| mla_attention |^\| mla_wgmma|^\| mla_combine|rror" /tmp/k.txt | cut -c1-140 | head -3 >> "$S"
  done
done
timeout 90 compute-sanitizer --tool racecheck --print-limit 5 .gpu2/tests/gpu_parity_mla \
  mla_small_cases --ignored --test-threads=1 --nocapture > /tmp/san_racecheck.log 2>&1
echo "racecheck gpu_parity_mla mla_small_cases rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|Hazard|test result" /tmp/san_racecheck.log | head -6 | cut -c1-200 >> "$S"
cp /tmp/san_racecheck.log "$OUT/"
if (( $(left) > 100 )); then
  SPECC_MLA_CASES=8x1 timeout 60 ncu --clock-control none -k 'regex:mla_(wgmma|combine)' --launch-count 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy \
    .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 > "$OUT/ncu.txt" 2>&1
  echo "ncu rc=$? ($((SECONDS - start))s)" >> "$S"
fi
if (( $(left) > 40 )); then
  timeout $(( $(left) - 10 )) .gpu2/tests/gpu_parity_mla mla_tile_split_sweep --ignored --nocapture \
    --test-threads=1 2>&1 | grep -E "SWEEP.*mla_wgmma|panicked" >> "$S"
fi
echo "total $((SECONDS - start))s" >> "$S"
