#!/usr/bin/env bash
# One device call: grouped MoE parity + bandwidth (gpu_quant_moe), quantised and DeepSeek
# end-to-end exactness, adaptive speculation through gpu_serve, the Kimi-K2 bf16 / int4 decode
# per kernel, then the 8B-shape serve sweep (plain vs draft_model, adaptive) while time is left.
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$SECONDS; BUDGET=${BUDGET:-570}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh gpu_quant_moe gpu_deepseek gpu_quant gpu_serve
grep -h "BANDWIDTH\|bit-identical" "$OUT/gpu_quant_moe.log" | head -20
chmod +x .gpu2/specc
for cfg in kimi-k2 kimi-k2-int4; do
  (( $(left) < 60 )) && { echo "skip $cfg: $(left)s left"; continue; }
  echo "== $cfg decode ($(left)s left)"
  timeout 80 .gpu2/specc bench "bench/configs/$cfg/config.json" --random-weights --layers 2 --iters 20 --per-kernel > "$OUT/bench_${cfg}.log" 2>&1
  grep -E "^\| verify|^\| g.*moe" "$OUT/bench_${cfg}.log" | head -4
done
(( $(left) > 150 )) && LANES=16 REQUESTS=16 TOKENS=32 CONC=1,4,16 timeout $(( $(left) - 5 )) bash scripts/device/serve_sweep_8b.sh none draft-1b-k7
echo "done with $(left)s left"
