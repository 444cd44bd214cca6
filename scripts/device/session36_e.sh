#!/usr/bin/env bash
# Session 36, call E: split-K inside the block for narrow CUDA-core matmuls (the f32 MoE
# router at 384 columns): GEMV parity against the interpreter (new split-K cases), the int4 /
# fp8 DeepSeek-V3 engines against HF and exact, then the Kimi-K2.5 int4 step and the 8B step
# against the previous build in the same call, and the 8B draft_model k = 7 step per kernel.
# Output to $OUT/summary.txt as it runs.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity kernels-gen/gpu_parity_qkv_rope gpu_quant, the previous build's specc
# as .gpu2/specc_base.gz.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-380}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
for t in gpu_parity gpu_parity_qkv_rope gpu_quant; do
  timeout 150 .gpu2/tests/$t --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1
  echo "$t rc=$? ($((SECONDS - start))s)" >> "$S"
  grep -E "test result|panicked|FAIL|k_warps|kw|router|384" "$OUT/$t.log" | grep -v uploading | head -12 >> "$S"
done
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for spec in "" "--tokens 8"; do
  for bin in specc_base specc; do
    (( $(left) > 40 )) || break
    echo "== Kimi-K2.5 int4 2 layers $spec $bin ($(left)s left)" >> "$S"
    timeout 60 .gpu2/$bin "${KI[@]}" $spec --per-kernel > "$OUT/k.txt" 2>&1
    grep -E "^\| (decode|verify)" "$OUT/k.txt" | head -1 | cut -c1-150 >> "$S"
    grep -E "^\| (gemv|moe_route) " "$OUT/k.txt" | cut -c1-120 | head -3 >> "$S"
    grep -E "gemv_f32" "$OUT/k.txt" | head -2 | cut -c1-140 >> "$S"
  done
done
T8=bench/configs/llama-3.1-8b/config.json
for spec in "" "--tokens 8"; do
  for bin in specc_base specc; do
    (( $(left) > 30 )) || break
    echo "== 8B B=1 $spec $bin ($(left)s left)" >> "$S"
    timeout 40 .gpu2/$bin bench $T8 --random-weights --iters 40 --context 1024 --batch 1 $spec 2>&1 \
      | grep -E "^\| (decode|verify)" | cut -c1-150 >> "$S"
  done
done
if (( $(left) > 40 )); then
  echo "== 8B draft_model tiny k = 7 per kernel ($(left)s left)" >> "$S"
  timeout 40 .gpu2/specc bench $T8 --random-weights --iters 40 --context 1024 --batch 1 \
    --spec bench/configs/draft-tiny-k7.toml --per-kernel > "$OUT/k.txt" 2>&1
  grep -E "^\| (spec|step|decode|verify|draft)" "$OUT/k.txt" | head -4 | cut -c1-150 >> "$S"
  sed -n '/^| phase/,/^$/p' "$OUT/k.txt" | cut -c1-120 >> "$S"
  sed -n '/^| family/,/^$/p' "$OUT/k.txt" | cut -c1-120 | head -14 >> "$S"
fi
rm -f "$OUT/k.txt"
echo "total $((SECONDS - start))s" >> "$S"
