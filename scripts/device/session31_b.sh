#!/usr/bin/env bash
# One device call (session 31): the GPU suites touched this session (gpu_e2e with chained
# bookkeeping, gpu_planted: the planted 8B family, gpu_quant, gpu_quant_moe: the int4 tensor-core
# experts and their Kimi-shape bandwidth), then the int4 Kimi-K2.5-shape steps, while the call has
# time left (BUDGET seconds, default 500).
# Pack: scripts/gpu-pack --specc gpu_e2e gpu_planted gpu_quant gpu_deepseek kernels-gen/gpu_quant_moe
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-500}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh gpu_quant_moe gpu_e2e gpu_planted gpu_quant
grep -h "BANDWIDTH\|bit-identical\|token 0" "$OUT/gpu_quant_moe.log" | tail -24
K=(.gpu2/specc bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for args in "--per-kernel" "--tokens 8" "--tokens 16" "--batch 8"; do
  (( $(left) < 60 )) && { echo "skip int4 $args: $(left)s left"; continue; }
  echo "== kimi-k2-int4 $args ($(left)s left)"
  timeout 150 "${K[@]}" $args > "$OUT/int4_${args// /_}.log" 2>&1
  grep -E '^\| [a-zA-Z]' "$OUT/int4_${args// /_}.log" | grep -v '^| step' | head -1
  grep -iE "moe_(gate|down)|experts read|error|panicked" "$OUT/int4_${args// /_}.log" | head -6
done
