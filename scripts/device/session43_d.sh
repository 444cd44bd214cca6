#!/usr/bin/env bash
# Session 43, call D: the warpgroups' ping-pong (`MlaTileParams.ping_pong`, session 42's
# variant, never run) against the interpreter and bitwise against the plan on small Kimi-K2
# cases and bucket invariance, its pair timings beside the plan's (split sweep at three
# cases); then the Kimi-K2.5 int4 verify of 8 tokens and decode at ctx 1024 (issue 20).
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla (specc as xz; the plan's kernels
# are 0fd1984's).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-230}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 40 .gpu2/tests/gpu_parity_mla mla_small_cases mla_tiles_are_bucket_invariant --include-ignored \
  --nocapture --test-threads=1 > /tmp/pp.log 2>&1
echo "small cases + invariance rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL|ping-pong" /tmp/pp.log | head -8 | cut -c1-200 >> "$S"
echo "PASS lines: $(grep -cE "PASS" /tmp/pp.log)" >> "$S"; cp /tmp/pp.log "$OUT/"
SPECC_MLA_CASES=${CASES:-1x1,8x1,1x4} timeout $(( $(left) > 60 ? 60 : $(left) - 5 )) .gpu2/tests/gpu_parity_mla mla_tile_split_sweep --ignored \
  --nocapture --test-threads=1 2>&1 | grep -E "SWEEP.*splits  32 mla_wgmma|panicked" >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30 --context 1024)
for spec in "--tokens 8" ""; do
  (( $(left) > 30 )) || break
  echo "== Kimi-K2.5 int4 2 layers ctx 1024 $spec ($(left)s left)" >> "$S"
  timeout 45 .gpu2/specc "${KI[@]}" $spec > /tmp/k.txt 2>&1
  grep -E "^\| (decode|verify)|experts|rror" /tmp/k.txt | head -3 | cut -c1-200 >> "$S"
  cp /tmp/k.txt "$OUT/kimi_int4_${spec// /_}.txt"
done
echo "total $((SECONDS - start))s" >> "$S"
