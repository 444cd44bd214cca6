#!/usr/bin/env bash
# Session 36, call C: the MLA tile work splits at Kimi-K2 dims, ctx 8192 (every split the
# kernel takes, beside the plan's), the Kimi-K2.5 int4 step with the one-warp router and the
# scanned dispatch / combine against the previous binary, and the 8B verify(8) with the
# q|k|v RoPE cos / sin after the norm barrier. Everything goes to $OUT/summary.txt as it
# runs (so a timeout still returns it).
# Pack: scripts/gpu-pack kernels-gen/gpu_parity_mla, with call B's specc and specc_base.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-400}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 120 .gpu2/tests/gpu_parity_mla mla_tile_split_sweep --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "^SWEEP|panicked" >> "$S"
echo "sweep $((SECONDS - start))s" >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for spec in "" "--tokens 8"; do
  for bin in specc_base specc; do
    f="$OUT/kimi_int4_$(echo "x$spec" | tr -cd 0-9)_$bin.txt"
    echo "== Kimi-K2.5 int4 2 layers $spec $bin ($(left)s left)" >> "$S"
    timeout 90 .gpu2/$bin "${KI[@]}" $spec --per-kernel > "$f" 2>&1
    grep -E "^\| (decode|verify)" "$f" | head -1 | cut -c1-150 >> "$S"
    grep -E "^\| (moe|mla)" "$f" | cut -c1-120 | head -6 >> "$S"
    rm -f "$f"
  done
done
T8=bench/configs/llama-3.1-8b/config.json
for bin in specc_base specc specc_base specc; do
  (( $(left) > 30 )) || break
  echo "== 8B verify T=8 B=1 $bin ($(left)s left)" >> "$S"
  timeout 40 .gpu2/$bin bench $T8 --random-weights --iters 40 --context 1024 --batch 1 --tokens 8 2>&1 \
    | grep -E "^\| verify" | cut -c1-150 >> "$S"
done
echo "total $((SECONDS - start))s" >> "$S"
