#!/usr/bin/env bash
# One device call: kernel parity (MLA tiles, grouped quant MoE, generic), end-to-end exactness
# (gpu_deepseek, gpu_quant, gpu_e2e), the MLA tile timings, then Kimi-K2 benches at ctx 8192
# while the call has time left (BUDGET seconds, default 540).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$SECONDS; BUDGET=${BUDGET:-540}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh gpu_parity_mla gpu_deepseek gpu_quant gpu_quant_moe gpu_generic gpu_e2e
echo "== mla timings ($(left)s left)"
timeout 90 .gpu2/tests/gpu_parity_mla --ignored --nocapture mla_tile_timings 2>&1 | grep -E "^kimi|panicked" | head -20
chmod +x .gpu2/specc
K=(.gpu2/specc bench bench/configs/kimi-k2/config.json --random-weights --layers 2 --iters 20 --context 8192 --per-kernel)
for bt in "1 1" "8 1" "1 4"; do
  set -- $bt
  (( $(left) < 70 )) && { echo "skip bench B=$1 T=$2: $(left)s left"; continue; }
  echo "== bench B=$1 T=$2 ctx 8192 ($(left)s left)"
  timeout $(( $(left) - 5 )) "${K[@]}" --batch "$1" --tokens "$2" > "$OUT/bench_b$1_t$2.log" 2>&1
  grep -iE "mla|median|roofline|step " "$OUT/bench_b$1_t$2.log" | head -14
done
