#!/usr/bin/env bash
# Session 51, call C (any card; prepared, not run: the session's device time was spent):
# 1. compile_quant over the one-token grouped MoE cases with the device's NVRTC (sm_90a,
# sm_100a, sm_120: the default tilings spill nowhere, the pipelined one is a known spill off
# sm_90a); 2. the int4 grouped kernels against the interpreter in both CoreTiling::VARIANTS;
# 3. the Kimi-K2.5 int4 6-layer decode as landed (int4 experts pipelined on sm_90a) and with
# the default tiling.
# Pack: scripts/gpu-pack --specc kernels-gen/compile_quant kernels-gen/gpu_quant_moe.
set -uo pipefail
BUDGET=${BUDGET:-150}; (( BUDGET > 150 )) && BUDGET=150  # the session's last device seconds
source scripts/device/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
SPECC_QUANT_CASES="T=1 " OUT=$OUT timeout 90 bash scripts/device/suite.sh \
  compile_quant:quantised_kernels_compile > /tmp/suite_c.txt 2>&1
grep -E "rc=|panicked|test result" /tmp/suite_c.txt | head -4 >> "$S"
grep -E "moe_grouped kimi (g2d4u2-p )?T=1 moe_(gate_up|down)" "$OUT/compile_quant.log" \
  | sed -E 's/ +/ /g' | cut -c1-100 | head -12 >> "$S"
grep -E "SPILL|spill bytes" "$OUT/compile_quant.log" | head -10 >> "$S"
echo "($(left)s left)" >> "$S"
(( $(left) > 50 )) && OUT=$OUT timeout $(( $(left) - 45 )) bash scripts/device/suite.sh \
  gpu_quant_moe:int4_grouped_experts_match_interpreter > /tmp/suite.txt 2>&1
grep -E "^==|rc=|panicked|test result" /tmp/suite.txt | head -4 >> "$S"
for t in default g2d4u2; do
  (( $(left) > 35 )) || break
  v=$t; [[ $t == default ]] && v=""
  r=$(SPECC_MOE_TILING=$v timeout 40 .gpu2/specc bench $KIMI --random-weights --layers 6 \
    --iters 30 --context 1024 2>&1 | grep -E "^\| decode|rror" | head -1 | cut -c1-110)
  echo "kimi l6 $t: $r" >> "$S"
done
echo "total $((SECONDS - start))s" >> "$S"
