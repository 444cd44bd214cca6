#!/usr/bin/env bash
# Session 44, call A: session 43's call D (the ping-pong's check and sweep, the Kimi-K2.5
# int4 verify of 8 and decode at ctx 1024 — issue 20 on an H200), then issue 22's 8B table in
# the same call: decode and verify(8) at B = 1, 8, 32, 64, ctx 1024, against compiled
# PyTorch layers under a graph, with the physical roofline. Output in $OUT/summary.txt.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
BUDGET=${D_BUDGET:-210} bash scripts/device/session43_d.sh
S="$OUT/summary.txt"
T=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 1" "--batch 1 --tokens 8" "--batch 8" "--batch 8 --tokens 8" "--batch 32" \
  "--batch 32 --tokens 8" "--batch 64" "--batch 64 --tokens 8"; do
  (( $(left) > 45 )) || break
  echo "== 8B $spec ($(left)s left)" >> "$S"
  timeout $(( $(left) > 70 ? 60 : $(left) - 10 )) .gpu2/specc bench $T --random-weights --iters 40 \
    --context 1024 $spec --compare --torch-modes graph,compile-layers > /tmp/b.txt 2>&1
  grep -E "^\||torch|rror" /tmp/b.txt | grep -v "^|---" | cut -c1-220 | tail -8 >> "$S"
  cp /tmp/b.txt "$OUT/8b_${spec// /_}.txt"
done
echo "total $((SECONDS - start))s" >> "$S"
