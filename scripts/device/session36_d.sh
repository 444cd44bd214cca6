#!/usr/bin/env bash
# Session 36, call D: MLA at 32 capacity-fixed splits (`gpu_parity_mla`: interpreter parity
# at fixture and Kimi dims to ctx 8192, bucket invariance; the split sweep with the plan's
# marks), the Kimi-K2.5 int4 step at ctx 8192 against the 64-split binary, and the verify
# steps of issue 19 (T = 2, 4, 8 at ctx 1024, per kernel at 8). Output to $OUT/summary.txt.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla, `b3a806c`'s specc as specc_base.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-300}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 150 .gpu2/tests/gpu_parity_mla --test-threads=1 --nocapture > "$OUT/parity_mla.log" 2>&1
echo "gpu_parity_mla rc=$?" >> "$S"
grep -E "test result|panicked|FAIL" "$OUT/parity_mla.log" | head -5 >> "$S"
grep -cE "PASS" "$OUT/parity_mla.log" >> "$S"
timeout 60 .gpu2/tests/gpu_parity_mla mla_tile_split_sweep --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "plan|panicked" >> "$S"
echo "checks $((SECONDS - start))s" >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for spec in "--context 8192" "--context 8192 --tokens 4"; do
  for bin in specc_base specc; do
    echo "== Kimi-K2.5 int4 2 layers $spec $bin ($(left)s left)" >> "$S"
    timeout 60 .gpu2/$bin "${KI[@]}" $spec --per-kernel > "$OUT/k.txt" 2>&1
    grep -E "^\| (decode|verify)" "$OUT/k.txt" | head -1 | cut -c1-150 >> "$S"
    grep -E "^\| mla" "$OUT/k.txt" | cut -c1-120 | head -2 >> "$S"
  done
done
for t in 2 4; do
  (( $(left) > 40 )) || break
  echo "== Kimi-K2.5 int4 2 layers --tokens $t ($(left)s left)" >> "$S"
  timeout 40 .gpu2/specc "${KI[@]}" --tokens $t 2>&1 | grep -E "^\| (decode|verify)" | cut -c1-150 >> "$S"
done
if (( $(left) > 40 )); then
  echo "== Kimi-K2.5 int4 2 layers --tokens 8 per kernel ($(left)s left)" >> "$S"
  timeout 40 .gpu2/specc "${KI[@]}" --tokens 8 --per-kernel > "$OUT/k.txt" 2>&1
  grep -E "^\| (verify)" "$OUT/k.txt" | head -1 | cut -c1-150 >> "$S"
  sed -n '/^| family/,/^$/p' "$OUT/k.txt" | cut -c1-120 >> "$S"
fi
rm -f "$OUT/k.txt"
echo "total $((SECONDS - start))s" >> "$S"
