#!/usr/bin/env bash
# Session 36, call B: the one-warp `moe_route`, the scanned `moe_dispatch` / `moe_combine`
# (interpreter parity of every generic case, the grouped kernels at Kimi / DeepSeek shapes,
# the DeepSeek-V3 engines end to end and against HF, int4 / fp8 engines), their latency in
# the Kimi-K2.5 int4 and Kimi-K2 bf16 steps against the previous binary in the same call,
# MLA at ctx 8192, and the 8B verify(8) with the q|k|v RoPE cos / sin after the norm barrier.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_generic kernels-gen/gpu_quant_moe \
#   gpu_deepseek gpu_quant, plus `b3a806c`'s specc as .gpu2/specc_base.gz.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh gpu_generic gpu_quant_moe gpu_deepseek gpu_quant 2>&1 \
  | grep -vE "^test .* ok$|uploading" | tail -40
grep -E "moe_route|moe_dispatch|moe_combine" "$OUT/gpu_generic.log" | head -20
echo "checks $((SECONDS - start))s"
timeout 60 .gpu2/tests/gpu_generic generic_kernel_timings --ignored --nocapture 2>&1 \
  | grep -E "moe" | head -12
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for spec in "" "--tokens 8"; do
  for bin in specc_base specc; do
    f="$OUT/kimi_int4_$(echo "x$spec" | tr -cd 0-9)_$bin.txt"
    echo "== Kimi-K2.5 int4 2 layers $spec $bin ($(left)s left)"
    timeout 120 .gpu2/$bin "${KI[@]}" $spec --per-kernel > "$f" 2>&1
    grep -E "^\| (decode|verify)" "$f" | head -1 | cut -c1-150
    grep -E "^\| moe" "$f" | cut -c1-120 | head -6
  done
done
KB=(bench bench/configs/kimi-k2/config.json --random-weights --layers 2 --iters 30)
for ctx in 1024 8192; do
  for bin in specc_base specc; do
    f="$OUT/kimi_bf16_${ctx}_${bin}.txt"
    echo "== Kimi-K2 bf16 2 layers ctx $ctx $bin ($(left)s left)"
    timeout 120 .gpu2/$bin "${KB[@]}" --context $ctx --per-kernel > "$f" 2>&1
    grep -E "^\| (decode|verify)" "$f" | head -1 | cut -c1-150
    grep -E "^\| (moe|mla)" "$f" | cut -c1-120 | head -8
  done
done
T8=bench/configs/llama-3.1-8b/config.json
for bin in specc_base specc specc_base specc; do
  echo "== 8B verify T=8 B=1 $bin ($(left)s left)"
  timeout 60 .gpu2/$bin bench $T8 --random-weights --iters 40 --context 1024 --batch 1 --tokens 8 2>&1 \
    | grep -E "^\| verify" | cut -c1-150
done
echo "total $((SECONDS - start))s"
