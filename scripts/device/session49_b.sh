#!/usr/bin/env bash
# Session 49, call B (H200 wanted): issue 22's 8B table with the current defaults (hoisted
# wgmma descriptors, the combine folded into the attention tiles from two tokens), decode and
# verify(8) at B = 32, 64, 8, 1, ctx 1024, each against compiled PyTorch layers in the same
# run; then session49_a.sh (slot-warp tile parity and the decode A/Bs) with what is left.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_attn (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
# A call brings back at most 8 files: the details go to /tmp/o and come back as one archive.
REAL_OUT=$OUT; OUT=/tmp/o; mkdir -p $OUT; export OUT
trap 'cp "$OUT/summary.txt" "$REAL_OUT/"; tar czf "$REAL_OUT/details.tgz" -C "$OUT" .' EXIT
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
T=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 32 --tokens 8" "--batch 32" "--batch 64 --tokens 8" "--batch 64" \
  "--batch 8" "--batch 8 --tokens 8" "--batch 1" "--batch 1 --tokens 8" "--batch 16" \
  "--batch 16 --tokens 8"; do
  (( $(left) > 45 )) || break
  echo "== 8B $spec ($(left)s left)" >> "$S"
  timeout $(( $(left) > 70 ? 60 : $(left) - 10 )) .gpu2/specc bench $T --random-weights --iters 40 \
    --context 1024 $spec --compare --torch-modes graph,compile-layers > /tmp/b.txt 2>&1
  grep -E "^\||torch|rror" /tmp/b.txt | grep -v "^|---" | cut -c1-220 | tail -8 >> "$S"
  cp /tmp/b.txt "$OUT/8b_${spec// /_}.txt"
done
echo "table $((SECONDS - start))s" >> "$S"
BUDGET=$(left) bash scripts/device/session49_a.sh
