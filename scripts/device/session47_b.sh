#!/usr/bin/env bash
# Session 47, call B (H200): where the 8B steps' time goes — per-kernel tables of decode B = 1,
# decode B = 32 and verify(8) B = 32 (ctx 1024) — and PDL on / off in the same call.
# Pack: scripts/gpu-pack --specc (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-400}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
T=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 1" "--batch 32" "--batch 32 --tokens 8"; do
  (( $(left) > 40 )) || break
  n="${spec// /_}"
  timeout 90 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 $spec --per-kernel \
    > "$OUT/pk$n.txt" 2>&1
  echo "== per-kernel $spec rc=$? ($(left)s left)" >> "$S"
  grep -E "^\| (decode|verify)" "$OUT/pk$n.txt" | head -2 >> "$S"
done
for round in 1 2; do
  for pdl in 0 1; do
    for spec in "--batch 1" "--batch 32" "--batch 32 --tokens 8"; do
      (( $(left) > 25 )) || break
      r=$(SPECC_PDL=$pdl timeout 40 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 $spec 2>&1 \
        | grep -E "^\| (decode|verify)|programmatic" | tr '\n' ' ' | cut -c1-200)
      echo "PDL=$pdl $spec: $r" >> "$S"
    done
  done
done
echo "total $((SECONDS - start))s" >> "$S"
