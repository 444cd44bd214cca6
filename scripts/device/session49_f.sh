#!/usr/bin/env bash
# Session 49, call F (short, any card): the Kimi-K2.5 int4 step beyond 2 layers (issue 20 names
# "the layer count that fits"): verify(8) and decode at B = 1, ctx 1024, 6 layers (5 MoE),
# each against its union-of-experts roofline. Pack: scripts/gpu-pack --specc.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-200}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
K=bench/configs/kimi-k2-int4/config.json
for spec in "--tokens 8" ""; do
  (( $(left) > 30 )) || break
  timeout $(( $(left) - 10 )) .gpu2/specc bench $K --random-weights --layers ${LAYERS:-6} --iters 20 \
    --context 1024 $spec > /tmp/k.txt 2>&1
  echo "== kimi layers ${LAYERS:-6} $spec rc=$? ($(left)s left)" >> "$S"
  grep -E "^\||experts|rror|roofline" /tmp/k.txt | grep -v "^|---" | cut -c1-220 | tail -6 >> "$S"
done
echo "total $((SECONDS - start))s" >> "$S"
