#!/usr/bin/env bash
# Session 49, call D (whatever card comes): session49_a.sh (the slot-warp decode tiles'
# parity, never run on a device, and their A/Bs) within 300 s, then the Kimi-K2.5 int4 part
# of session49_c.sh (2 layers and the most this card holds, per-kernel verify(8)).
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_attn (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
REAL_OUT=$OUT; OUT=/tmp/o; mkdir -p $OUT; export OUT
trap 'cp "$OUT/summary.txt" "$REAL_OUT/"; tar czf "$REAL_OUT/details.tgz" -C "$OUT" .' EXIT
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
BUDGET=300 bash scripts/device/session49_a.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
many=6; [[ $name == *H200* ]] && many=12
K=bench/configs/kimi-k2-int4/config.json
for layers in 2 $many; do
  for spec in "" "--tokens 8"; do
    (( $(left) > 60 )) || break
    n="kimi_l${layers}${spec// /_}"
    pk=""; [[ -n $spec ]] && pk="--per-kernel"
    timeout $(( $(left) - 20 )) .gpu2/specc bench $K --random-weights --layers $layers --iters 30 \
      --context 1024 $spec $pk > "$OUT/$n.txt" 2>&1
    echo "== $n rc=$? ($(left)s left)" >> "$S"
    grep -E "^\| (decode|verify)|experts|rror" "$OUT/$n.txt" | head -4 | cut -c1-200 >> "$S"
    [[ -n $pk ]] && sed -n '/^| family/,/^| group/p' "$OUT/$n.txt" >> "$S"
  done
done
echo "total $((SECONDS - start))s" >> "$S"
