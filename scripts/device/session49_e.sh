#!/usr/bin/env bash
# Session 49, call E (H200 wanted; short): issue 22's 8B table with the current defaults,
# each step against compiled PyTorch layers in the same run, the figures the issue names
# first. Pack: scripts/gpu-pack --specc (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-240}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
T=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 32 --tokens 8" "--batch 32" "--batch 64 --tokens 8" "--batch 64" \
  "--batch 8 --tokens 8" "--batch 8" "--batch 1" "--batch 1 --tokens 8"; do
  (( $(left) > 30 )) || break
  echo "== 8B $spec ($(left)s left)" >> "$S"
  timeout $(( $(left) > 60 ? 50 : $(left) - 8 )) .gpu2/specc bench $T --random-weights --iters 40 \
    --context 1024 $spec --compare --torch-modes graph,compile-layers > /tmp/b.txt 2>&1
  grep -E "^\||torch|rror" /tmp/b.txt | grep -v "^|---" | cut -c1-220 | tail -8 >> "$S"
done
echo "total $((SECONDS - start))s" >> "$S"
