#!/usr/bin/env bash
# Prepared in session 47 (H200 wanted): why the Kimi-K2.5 int4 verify(8) is 1.37× its
# union-of-experts roofline on the H200 (1.18× on the H100): per-kernel tables of the int4
# decode and verify(8) at ctx 1024, and the verify with the GEMV units in flight raised
# (SPECC_GEMV_UNROLL=8: the dense layers' 8-row splits), alternating.
# Then per-kernel tables of the 8B decode / verify(8) at B = 8 and 64 and verify(8) at B = 1
# (issue 22's limiter for each missed target).
# Pack: scripts/gpu-pack --specc (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-240}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
K=bench/configs/kimi-k2-int4/config.json
for spec in "" "--tokens 8"; do
  n="kimi${spec// /_}"
  timeout 60 .gpu2/specc bench $K --random-weights --layers 2 --iters 30 --context 1024 $spec \
    --per-kernel > "$OUT/$n.txt" 2>&1
  echo "== $n rc=$? ($(left)s left)" >> "$S"
  grep -E "^\| (decode|verify)" "$OUT/$n.txt" | head -1 >> "$S"
  sed -n '/^| family/,/^| group/p' "$OUT/$n.txt" >> "$S"
done
for u in "" 8 "" 8; do
  (( $(left) > 25 )) || break
  r=$(SPECC_GEMV_UNROLL=$u timeout 40 .gpu2/specc bench $K --random-weights --layers 2 --iters 30 \
    --context 1024 --tokens 8 2>&1 | grep -E "^\| verify|rror" | head -2 | cut -c1-110 | tr '\n' ' ')
  echo "verify(8) unroll=${u:-default}: $r" >> "$S"
done
# Issue 22's limiter analysis: per-kernel tables of the 8B steps not yet tabled on the H200.
T=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 8" "--batch 8 --tokens 8" "--batch 64" "--batch 64 --tokens 8" "--batch 1 --tokens 8"; do
  (( $(left) > 60 )) || break
  n="8b${spec// /_}"
  timeout 90 .gpu2/specc bench $T --random-weights --iters 30 --context 1024 $spec \
    --per-kernel > "$OUT/$n.txt" 2>&1
  echo "== $n rc=$? ($(left)s left)" >> "$S"
  grep -E "^\| (decode|verify)" "$OUT/$n.txt" | head -1 >> "$S"
  sed -n '/^| family/,/^| group/p' "$OUT/$n.txt" >> "$S"
done
echo "total $((SECONDS - start))s" >> "$S"
