#!/usr/bin/env bash
# Session 43, call A: the warpgroups' ping-pong (`MlaTileParams.ping_pong`) against the
# interpreter and bitwise against the plan on small Kimi-K2 cases, bucket invariance, its
# pair timings beside the plan's (the split sweep at three cases); then issue 20's Kimi-K2.5
# int4 steps at ctx 1024 (decode, verify T = 2..16 at B = 1, decode and verify 8 at B = 8).
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla gpu_deepseek (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-330}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 40 .gpu2/tests/gpu_parity_mla mla_small_cases mla_tiles_are_bucket_invariant --include-ignored \
  --nocapture --test-threads=1 > /tmp/pp.log 2>&1
echo "small cases + invariance rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL|ping-pong" /tmp/pp.log | head -6 | cut -c1-200 >> "$S"
echo "PASS lines: $(grep -cE "PASS" /tmp/pp.log)" >> "$S"; cp /tmp/pp.log "$OUT/"
SPECC_MLA_CASES=1x1,8x1,1x4 timeout 60 .gpu2/tests/gpu_parity_mla mla_tile_split_sweep --ignored \
  --nocapture --test-threads=1 2>&1 | grep -E "SWEEP.*splits  32 mla_wgmma|panicked" >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30 --context 1024)
for spec in "" "--tokens 2" "--tokens 4" "--tokens 8" "--tokens 16" "--batch 8" "--batch 8 --tokens 8"; do
  (( $(left) > 30 )) || break
  echo "== Kimi-K2.5 int4 2 layers ctx 1024 $spec ($(left)s left)" >> "$S"
  timeout 45 .gpu2/specc "${KI[@]}" $spec > /tmp/k.txt 2>&1
  grep -E "^\| (decode|verify)|experts|rror" /tmp/k.txt | head -3 | cut -c1-200 >> "$S"
  cp /tmp/k.txt "$OUT/kimi_int4_${spec// /_}.txt"
done
echo "total $((SECONDS - start))s" >> "$S"
