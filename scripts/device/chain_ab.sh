#!/usr/bin/env bash
# One device call: correctness of every step graph with chained bookkeeping (the suites), then
# the same steps timed with the binary before chains (.gpu2/specc_base) and after
# (.gpu2/specc), alternating, while the call has time left (BUDGET seconds, default 540).
# Pack: scripts/gpu-pack --specc gpu_e2e gpu_deepseek gpu_serve kernels-gen/gpu_quant_moe
# kernels-gen/gpu_generic, plus the base binary as .gpu2/specc_base.gz.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-540}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh ${SUITES:-gpu_e2e gpu_deepseek gpu_serve gpu_generic gpu_quant_moe}
run() {  # label, args...
  local label=$1; shift
  for bin in specc_base specc; do
    (( $(left) < 60 )) && { echo "skip $label $bin: $(left)s left"; return; }
    timeout 150 .gpu2/$bin bench "$@" > "$OUT/ab_${label}_$bin.log" 2>&1
    echo "$label $bin: $(grep -E '^\| [a-zA-Z]' "$OUT/ab_${label}_$bin.log" | grep -v '^| step' | head -1 | tr -s ' ')"
    grep -iE "error|panicked" "$OUT/ab_${label}_$bin.log" | head -2
  done
}
K=(bench/configs/kimi-k2/config.json --random-weights --layers 2 --iters 30)
run kimi_decode "${K[@]}"
run kimi_eagle3 "${K[@]}" --spec bench/configs/eagle3-kimi-k3.toml
L=(bench/configs/llama-3.1-8b/config.json --random-weights --iters 30 --context 1024)
run 8b_decode "${L[@]}"
run 8b_eagle3 "${L[@]}" --spec bench/configs/eagle3-k7.toml
run 8b_ddtree "${L[@]}" --spec bench/configs/ddtree-b32.toml
