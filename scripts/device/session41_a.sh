#!/usr/bin/env bash
# Session 41, call A: `mla_wgmma` (sm_90a: 64 query rows a block on two warpgroups, TMA-fed
# cache tiles, scores and P·c on wgmma): parity and bucket invariance of both MLA kernels
# against the interpreter, their tile / combine times at Kimi-K2 dims, the engine test at
# the dims it takes (draft_model exact), and the Kimi-K2.5 int4 steps with it and without it
# (`SPECC_MLA_WGMMA=0`) in the same call.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla gpu_deepseek (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-480}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 150 .gpu2/tests/gpu_parity_mla --test-threads=1 --nocapture > /tmp/parity_mla.log 2>&1
echo "gpu_parity_mla rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL|mismatch" /tmp/parity_mla.log | head -8 | cut -c1-300 >> "$S"
echo "PASS lines: $(grep -cE "PASS" /tmp/parity_mla.log)" >> "$S"
cp /tmp/parity_mla.log "$OUT/"
timeout 60 .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "kimi B|panicked" >> "$S"
timeout 120 .gpu2/tests/gpu_deepseek mla_wgmma_dims --test-threads=1 --nocapture > /tmp/ds.log 2>&1
echo "gpu_deepseek mla_wgmma_dims rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "exact|test result|panicked" /tmp/ds.log | cut -c1-300 | head -8 >> "$S"
cp /tmp/ds.log "$OUT/"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for spec in "--context 8192" "--context 8192 --tokens 4" "--context 8192 --batch 8"; do
  for flag in 0 1; do
    (( $(left) > 100 )) || break
    echo "== Kimi-K2.5 int4 2 layers $spec SPECC_MLA_WGMMA=$flag ($(left)s left)" >> "$S"
    SPECC_MLA_WGMMA=$flag timeout 60 .gpu2/specc "${KI[@]}" $spec --per-kernel > /tmp/k.txt 2>&1
    grep -E "^\| (decode|verify)" /tmp/k.txt | head -1 | cut -c1-150 >> "$S"
    grep -E "^\| mla_attention |^\| mla_tile|^\| mla_wgmma|^\| mla_combine|rror" /tmp/k.txt | cut -c1-140 | head -3 >> "$S"
  done
done
(( $(left) > 80 )) && timeout 70 .gpu2/tests/gpu_parity_mla mla_tile_split_sweep --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "SWEEP.*(wgmma|plan)|panicked" >> "$S"
for tool in memcheck racecheck; do
  (( $(left) > 70 )) || break
  timeout 60 compute-sanitizer --tool $tool --print-limit 5 .gpu2/tests/gpu_deepseek mla_wgmma_dims \
    --test-threads=1 --nocapture > /tmp/san_$tool.log 2>&1
  echo "sanitizer $tool rc=$? ($((SECONDS - start))s)" >> "$S"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result|panicked" /tmp/san_$tool.log | tail -3 >> "$S"
  cp /tmp/san_$tool.log "$OUT/"
done
echo "total $((SECONDS - start))s" >> "$S"
