#!/usr/bin/env bash
# Session 39, call B (checks first): the split-K GEMV's weights-ahead loop (the f32 router)
# against the interpreter; q_a|kv_a stacked into one matmul whose readers take their
# columns in place, through the DeepSeek-V3 engines against HF (bf16 / f32 and int4 / fp8
# fixtures, every method); the int4 Kimi-K2.5 steps base (816e8e2) / new in one call, per
# kernel at verify(8); then the gemv work-split sweep at the Kimi-K2 verify(8) shapes.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity kernels-gen/gpu_kimi_splits
# kernels-gen/gpu_mla_prep gpu_deepseek gpu_quant; 816e8e2's specc as specc_base (xz -9e).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS
left() { echo $((590 - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 60 .gpu2/tests/gpu_parity --test-threads=1 --nocapture > /tmp/parity.log 2>&1
echo "gpu_parity rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked" /tmp/parity.log | cut -c1-200 | head -8 >> "$S"
timeout 50 .gpu2/tests/gpu_mla_prep --test-threads=1 > /tmp/prep.log 2>&1
echo "gpu_mla_prep rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked" /tmp/prep.log | cut -c1-200 | head -4 >> "$S"
timeout 120 .gpu2/tests/gpu_deepseek --test-threads=1 > /tmp/deepseek.log 2>&1
echo "gpu_deepseek rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" /tmp/deepseek.log | cut -c1-200 | head -6 >> "$S"
timeout 100 .gpu2/tests/gpu_quant --test-threads=1 > /tmp/quant.log 2>&1
echo "gpu_quant rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" /tmp/quant.log | cut -c1-200 | head -6 >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for bin in specc_base specc; do
  timeout 45 .gpu2/$bin "${KI[@]}" --tokens 8 --per-kernel > /tmp/k.txt 2>&1
  grep -E "^\| " /tmp/k.txt | cut -c1-160 | head -60 > "$OUT/pk_int4_v8_$bin.txt"
  echo "== $bin verify8: $(grep -E '^\| verify' /tmp/k.txt | head -1 | cut -c1-120)" >> "$S"
done
for bin in specc_base specc; do
  echo "== $bin decode: $(timeout 35 .gpu2/$bin "${KI[@]}" 2>&1 | grep -E '^\| decode' | head -1 | cut -c1-120)" >> "$S"
done
(( $(left) > 40 )) && {
  timeout $(( $(left) - 10 )) .gpu2/tests/gpu_kimi_splits --ignored --nocapture > /tmp/splits.log 2>&1
  echo "gpu_kimi_splits rc=$? ($((SECONDS - start))s)" >> "$S"
  grep -vE "^\s*$|^running|^test " /tmp/splits.log | cut -c1-200 > "$OUT/splits.txt"
}
echo "total $((SECONDS - start))s" >> "$S"
