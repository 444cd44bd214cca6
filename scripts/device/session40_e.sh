#!/usr/bin/env bash
# Session 40, call E: `mla_tile` with the score's features split over the row tile's four
# warps (q fragments in registers, four independent accumulator chains, blocks of at most
# 32 rows): parity and bucket invariance against the interpreter, the tile / combine times
# and the split sweep; gpu_deepseek (bf16 DeepSeek-V3 engines against HF, every method); the
# Kimi-K2.5 int4 and Kimi-K2 bf16 steps against HEAD's build in the same call.
# Pack (into .gpu3, carried as such): scripts/gpu-pack --specc kernels-gen/gpu_parity_mla
# gpu_deepseek, the base specc as .gpu3/specc_base.xz, specc recompressed as xz.
set -uo pipefail
rm -rf .gpu2 && mv .gpu3 .gpu2
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-480}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 120 .gpu2/tests/gpu_parity_mla --test-threads=1 --nocapture > /tmp/parity_mla.log 2>&1
echo "gpu_parity_mla rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL|mismatch" /tmp/parity_mla.log | head -8 | cut -c1-200 >> "$S"
echo "PASS lines: $(grep -cE "PASS" /tmp/parity_mla.log)" >> "$S"
cp /tmp/parity_mla.log "$OUT/"
timeout 40 .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "kimi B|panicked" >> "$S"
timeout 60 .gpu2/tests/gpu_parity_mla mla_tile_split_sweep --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "SWEEP|panicked" >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
KB=(bench bench/configs/kimi-k2/config.json --random-weights --layers 2 --iters 30)
for spec in "--context 8192" "--context 8192 --tokens 4" "--context 8192 --batch 8"; do
  for bin in specc_base specc; do
    (( $(left) > 150 )) || break
    echo "== Kimi-K2.5 int4 2 layers $spec $bin ($(left)s left)" >> "$S"
    timeout 60 .gpu2/$bin "${KI[@]}" $spec --per-kernel > /tmp/k.txt 2>&1
    grep -E "^\| (decode|verify)" /tmp/k.txt | head -1 | cut -c1-150 >> "$S"
    grep -E "^\| mla_attention |^\| mla_tile|^\| mla_combine" /tmp/k.txt | cut -c1-120 | head -2 >> "$S"
  done
done
for bin in specc_base specc; do
  (( $(left) > 140 )) || break
  echo "== Kimi-K2 bf16 2 layers ctx 8192 $bin ($(left)s left)" >> "$S"
  timeout 60 .gpu2/$bin "${KB[@]}" --context 8192 2>&1 | grep -E "^\| (decode|verify)" | head -1 | cut -c1-150 >> "$S"
done
timeout $(( $(left) > 220 ? 220 : $(left) )) .gpu2/tests/gpu_deepseek --test-threads=1 > /tmp/deepseek.log 2>&1
echo "gpu_deepseek rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "^test |test result|panicked|FAIL" /tmp/deepseek.log | cut -c1-200 | head -16 >> "$S"
echo "total $((SECONDS - start))s" >> "$S"
