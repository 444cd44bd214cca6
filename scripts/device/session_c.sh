#!/usr/bin/env bash
# One device call: grouped MoE parity + bandwidth (gpu_quant_moe), quantised and DeepSeek
# end-to-end exactness, adaptive speculation through the GPU tests (gpu_serve, gpu_e2e), then
# the Kimi-K2 bf16 / int4 benches (decode per kernel, verify T = 8) while time is left.
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh gpu_quant_moe gpu_deepseek gpu_quant gpu_serve gpu_e2e
grep -h "BANDWIDTH\|bit-identical" "$OUT/gpu_quant_moe.log" | head -20
chmod +x .gpu2/specc
for cfg in kimi-k2 kimi-k2-int4; do
  K=(.gpu2/specc bench "bench/configs/$cfg/config.json" --random-weights --layers 2 --iters 20)
  for t in 1 8; do
    (( $(left) < 60 )) && { echo "skip $cfg T=$t: $(left)s left"; continue; }
    echo "== $cfg T=$t ($(left)s left)"
    timeout $(( $(left) - 5 )) "${K[@]}" --tokens "$t" --per-kernel > "$OUT/bench_${cfg}_t$t.log" 2>&1
    grep -E "^\| verify|^\| g.*moe" "$OUT/bench_${cfg}_t$t.log" | head -6
  done
done
