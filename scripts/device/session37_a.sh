#!/usr/bin/env bash
# Session 37, call A: the MLA combine with batched partial loads (bit-identical folds):
# interpreter parity and bucket invariance, the tile / combine split per launch, the split x
# rows x stages sweep; the Kimi-K2.5 int4 step at ctx 8192 against the previous build; the
# per-kernel tables of the int4 verify(8) step and the 8B draft_model k = 7 step (kept whole).
# Output to $OUT/summary.txt as it runs.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla, the previous build's specc as
# .gpu2/specc_base.gz.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-400}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 150 .gpu2/tests/gpu_parity_mla --test-threads=1 --nocapture > "$OUT/parity_mla.log" 2>&1
echo "gpu_parity_mla rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" "$OUT/parity_mla.log" | head -5 >> "$S"
grep -cE "PASS" "$OUT/parity_mla.log" >> "$S"
timeout 40 .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "^kimi|panicked" >> "$S"
timeout 90 .gpu2/tests/gpu_parity_mla mla_tile_split_sweep --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "SWEEP|panicked" | sed 's/SWEEP kimi //' >> "$S"
echo "mla $((SECONDS - start))s" >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for bin in specc_base specc; do
  (( $(left) > 40 )) || break
  echo "== Kimi-K2.5 int4 2 layers ctx 8192 $bin ($(left)s left)" >> "$S"
  timeout 60 .gpu2/$bin "${KI[@]}" --context 8192 --per-kernel > "$OUT/k.txt" 2>&1
  grep -E "^\| (decode|verify)" "$OUT/k.txt" | head -1 | cut -c1-150 >> "$S"
  grep -E "^\| mla" "$OUT/k.txt" | cut -c1-120 | head -3 >> "$S"
done
if (( $(left) > 40 )); then
  echo "== Kimi-K2.5 int4 2 layers --tokens 8 per kernel ($(left)s left)" >> "$S"
  timeout 60 .gpu2/specc "${KI[@]}" --tokens 8 --per-kernel > "$OUT/kimi_int4_verify8.txt" 2>&1
  grep -E "^\| (verify)" "$OUT/kimi_int4_verify8.txt" | head -1 | cut -c1-150 >> "$S"
fi
T8=bench/configs/llama-3.1-8b/config.json
if (( $(left) > 40 )); then
  echo "== 8B draft_model tiny k = 7 per kernel ($(left)s left)" >> "$S"
  timeout 50 .gpu2/specc bench $T8 --random-weights --iters 40 --context 1024 --batch 1 \
    --spec bench/configs/draft-tiny-k7.toml --per-kernel > "$OUT/draft_tiny_k7.txt" 2>&1
  grep -E "^\| (spec|step|decode|verify|draft)" "$OUT/draft_tiny_k7.txt" | head -4 | cut -c1-150 >> "$S"
fi
rm -f "$OUT/k.txt"
echo "total $((SECONDS - start))s" >> "$S"
