#!/usr/bin/env bash
# Session 35, call B: the Kimi-K2.5 int4 engine with the interleaved expert tiling from 8
# tokens (decode, verify 8 / 16, per kernel: the grouped experts, dispatch and combine at 384
# experts), `gpu_quant` (int4 / fp8 engines against HF, exactness), the 8B verify(8) step's
# q|k|v + RoPE kernels at B = 1, and 8B serving at c = 16, plain against EAGLE-3 (time to
# first token with the taps kept on the device).
# Pack: scripts/gpu-pack --specc gpu_quant
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-420}
left() { echo $((BUDGET - (SECONDS - start))); }
S=.gpu2/specc
bash scripts/device/suite.sh gpu_quant 2>&1 | grep -vE "^test .* ok$" | tail -8
K=($S bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for spec in "" "--tokens 8" "--tokens 16"; do
  f="$OUT/kimi_int4_$(echo "x$spec" | tr -cd 0-9).txt"
  echo "== Kimi-K2.5 int4, 2 layers $spec ($(left)s left)"
  timeout 120 "${K[@]}" $spec --per-kernel > "$f" 2>&1
  grep -E "^\| (decode|verify)" "$f" | head -2 | cut -c1-200
  grep -E "^\| g[0-9]+ \| moe|^\| moe" "$f" | cut -c1-160 | head -8
done
T8=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 1" "--batch 1 --tokens 8"; do
  f="$OUT/perkernel_b1_$(echo $spec | tr -cd 0-9).txt"
  echo "== 8B $spec ($(left)s left)"
  timeout 60 $S bench $T8 --random-weights --iters 40 --context 1024 $spec --per-kernel > "$f" 2>&1
  grep -E "^\| (decode|verify)" "$f" | cut -c1-150
  grep -E "qkv|rope" "$f" | sort -u -t'|' -k5,5 | head -6 | cut -c1-150
done
if (( $(left) > 130 )); then
  CONC=16 REQUESTS=32 timeout $(( $(left) - 5 )) bash scripts/device/serve_sweep_8b.sh none eagle3-k7 2>&1 \
    | grep -E "^== sweep|^ +16 " | tail -6
fi
echo "total $((SECONDS - start))s"
