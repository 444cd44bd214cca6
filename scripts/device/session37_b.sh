#!/usr/bin/env bash
# Session 37, call B: `head_matmul` in 16-byte vectors (generic cases against the
# interpreter, the DeepSeek-V3 engines against HF and exact through every method), the MLA
# tile with interleaved output products and the one-batch combine (parity, invariance, the
# tile / combine split), then Kimi-K2.5 int4 and Kimi-K2 bf16 steps against the previous
# build in the same call, per kernel. Output to $OUT/summary.txt as it runs.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla kernels-gen/gpu_generic
# gpu_deepseek, the previous build's specc as .gpu2/specc_base.gz.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 120 .gpu2/tests/gpu_generic --test-threads=1 --nocapture > "$OUT/generic.log" 2>&1
echo "gpu_generic rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" "$OUT/generic.log" | head -5 >> "$S"
grep -E "head_matmul" "$OUT/generic.log" | head -12 | cut -c1-140 >> "$S"
timeout 100 .gpu2/tests/gpu_parity_mla --test-threads=1 --nocapture > "$OUT/parity_mla.log" 2>&1
echo "gpu_parity_mla rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" "$OUT/parity_mla.log" | head -5 >> "$S"
grep -cE "PASS" "$OUT/parity_mla.log" >> "$S"
timeout 40 .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "kimi B|panicked" >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
KB=(bench bench/configs/kimi-k2/config.json --random-weights --layers 2 --iters 30)
for spec in "" "--tokens 8" "--context 8192"; do
  for bin in specc_base specc; do
    (( $(left) > 230 )) || break
    echo "== Kimi-K2.5 int4 2 layers $spec $bin ($(left)s left)" >> "$S"
    timeout 60 .gpu2/$bin "${KI[@]}" $spec --per-kernel > "$OUT/k.txt" 2>&1
    grep -E "^\| (decode|verify)" "$OUT/k.txt" | head -1 | cut -c1-150 >> "$S"
    grep -E "^\| (head_matmul|mla_attention) " "$OUT/k.txt" | cut -c1-120 | head -3 >> "$S"
  done
done
for bin in specc_base specc; do
  (( $(left) > 200 )) || break
  echo "== Kimi-K2 bf16 2 layers $bin ($(left)s left)" >> "$S"
  timeout 60 .gpu2/$bin "${KB[@]}" 2>&1 | grep -E "^\| (decode|verify)" | head -1 | cut -c1-150 >> "$S"
done
rm -f "$OUT/k.txt"
timeout $(( $(left) - 10 )) .gpu2/tests/gpu_deepseek --test-threads=1 > "$OUT/deepseek.log" 2>&1
echo "gpu_deepseek rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" "$OUT/deepseek.log" | head -5 >> "$S"
echo "total $((SECONDS - start))s" >> "$S"
