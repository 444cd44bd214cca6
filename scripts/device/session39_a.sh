#!/usr/bin/env bash
# Session 39, call A: HEAD (816e8e2: session 38's kernel refactors, which only renamed
# locals) on the device, and session 38's unrun call C: the deferred catch-up's long plain
# stretches, checked where plain decoding alone on the device equals the interpreter.
# Then the gemv work splits at the Kimi-K2 verify(8) shapes (the narrow-matrix rules).
# Pack: scripts/gpu-pack --specc gpu_serve gpu_deepseek kernels-gen/gpu_mla_prep
# kernels-gen/gpu_kimi_splits (specc xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 50 .gpu2/tests/gpu_mla_prep --test-threads=1 --nocapture > /tmp/prep.log 2>&1
echo "gpu_mla_prep rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked" /tmp/prep.log | cut -c1-200 | head -8 >> "$S"
timeout 170 .gpu2/tests/gpu_kimi_splits --ignored --nocapture > /tmp/splits.log 2>&1
echo "gpu_kimi_splits rc=$? ($((SECONDS - start))s)" >> "$S"
grep -vE "^\s*$|^running|^test " /tmp/splits.log | cut -c1-200 > "$OUT/splits.txt"
timeout 170 .gpu2/tests/gpu_serve --test-threads=1 --nocapture long_plain forced_variants \
  > /tmp/serve.log 2>&1
echo "gpu_serve long_plain + forced_variants rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|catch-up|checked|first_difference|lanes" /tmp/serve.log \
  | cut -c1-300 | head -40 >> "$S"
cp /tmp/serve.log "$OUT/serve.log"
timeout 110 .gpu2/tests/gpu_deepseek --test-threads=1 > /tmp/deepseek.log 2>&1
echo "gpu_deepseek rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" /tmp/deepseek.log | head -6 >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
timeout 60 .gpu2/specc "${KI[@]}" --tokens 8 --per-kernel > /tmp/k.txt 2>&1
grep -E "^\| " /tmp/k.txt | cut -c1-160 | head -60 > "$OUT/pk_int4_v8.txt"
echo "total $((SECONDS - start))s" >> "$S"
