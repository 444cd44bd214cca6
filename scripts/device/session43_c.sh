#!/usr/bin/env bash
# Session 43, call C: `mla_wgmma`'s variants — split scores (`split_scores`: each warpgroup
# scores its 32 slots, maxima and bf16 p exchanged in shared memory), f16 partials
# (`half_partials`), both, and the ping-pong — against the interpreter at every Kimi-K2
# case and bitwise bucket invariance; their pair timings beside the plan's; the engines with
# both (`SPECC_MLA_VARIANT=split,half`) exact through draft_model (gpu_deepseek
# mla_wgmma_dims); the Kimi-K2.5 int4 steps at ctx 8192 with and without them in the same
# call; racecheck of the small cases; on an H200 first issue 20's steps at ctx 1024.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla gpu_deepseek (specc as xz).
# Ran once, at 87bb28a (bench/NOTES.md, session 43); the variants were dropped after it.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-420}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu" >> "$S"
T=.gpu2/tests/gpu_parity_mla
timeout 90 $T mla_small_cases mla_tiles_are_bucket_invariant mla_tiles_match_interpreter_kimi_dims \
  --include-ignored --nocapture --test-threads=1 > /tmp/pp.log 2>&1
echo "kimi dims + small cases + invariance rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" /tmp/pp.log | head -6 | cut -c1-250 >> "$S"
echo "PASS lines: $(grep -cE "PASS" /tmp/pp.log), split-scores: $(grep -E "PASS" /tmp/pp.log | grep -c split-scores), half-partials: $(grep -E "PASS" /tmp/pp.log | grep -c half-partials)" >> "$S"
cp /tmp/pp.log "$OUT/"
SPECC_MLA_CASES=1x1,1x4,8x1,8x8 timeout 60 $T mla_tile_timings --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "kimi B|panicked" | grep -v "mla_tile rows" >> "$S"
if [[ $gpu == *H200* ]]; then
  KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30 --context 1024)
  for spec in "--tokens 8" "" "--tokens 16"; do
    (( $(left) > 200 )) || break
    echo "== Kimi-K2.5 int4 2 layers ctx 1024 $spec ($(left)s left)" >> "$S"
    timeout 45 .gpu2/specc "${KI[@]}" $spec > /tmp/k.txt 2>&1
    grep -E "^\| (decode|verify)|experts|rror" /tmp/k.txt | head -3 | cut -c1-200 >> "$S"
    cp /tmp/k.txt "$OUT/kimi_int4_${spec// /_}.txt"
  done
fi
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for spec in "--context 8192 --batch 8" "--context 8192" "--context 8192 --tokens 4"; do
  for v in "" "split,half"; do
    (( $(left) > 150 )) || break
    echo "== Kimi-K2.5 int4 2 layers $spec SPECC_MLA_VARIANT=$v ($(left)s left)" >> "$S"
    SPECC_MLA_VARIANT=$v timeout 45 .gpu2/specc "${KI[@]}" $spec --per-kernel > /tmp/k.txt 2>&1
    grep -E "^\| (decode|verify)" /tmp/k.txt | head -1 | cut -c1-150 >> "$S"
    grep -E "^\| mla_attention |^\| mla_wgmma|^\| mla_combine|rror" /tmp/k.txt | cut -c1-140 | head -3 >> "$S"
  done
done
if (( $(left) > 60 )); then
  SPECC_MLA_VARIANT=split,half timeout $(( $(left) - 10 )) .gpu2/tests/gpu_deepseek mla_wgmma_dims --test-threads=1 --nocapture > /tmp/ds.log 2>&1
  echo "gpu_deepseek mla_wgmma_dims (split,half) rc=$? ($((SECONDS - start))s)" >> "$S"
  grep -E "exact|test result|panicked" /tmp/ds.log | cut -c1-250 | head -6 >> "$S"; cp /tmp/ds.log "$OUT/"
fi
if (( $(left) > 100 )); then
  timeout 90 compute-sanitizer --tool racecheck --print-limit 5 $T mla_small_cases --ignored \
    --test-threads=1 --nocapture > /tmp/san_racecheck.log 2>&1
  echo "racecheck mla_small_cases rc=$? ($((SECONDS - start))s)" >> "$S"
  grep -E "RACECHECK SUMMARY|Hazard|test result" /tmp/san_racecheck.log | head -4 | cut -c1-200 >> "$S"
  cp /tmp/san_racecheck.log "$OUT/"
fi
echo "total $((SECONDS - start))s" >> "$S"
