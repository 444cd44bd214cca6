#!/usr/bin/env bash
# Session 51, call A (any card; ran at d947b18 — CoreTiling::VARIANTS has since kept only g2d4u2 and
# g2d4u2-p): the CUDA-core int4 expert kernels pipelined (the next trip's
# loads issued before the current trip's products; scales kept as stored until used), issue
# 20: at one token they ran at 64 % of copy, about what streaming and unpacking one after
# the other gives. 1. the grouped kernels against the interpreter (every CoreTiling at Kimi's
# shapes, pipelined odd fixtures); 2. kimi_bandwidth over every CoreTiling at T = 16, 8, 1;
# 3. the Kimi 6-layer decode and verify(8) with the default tiling and with the fastest at
# T = 1 (SPECC_MOE_TILING), alternating; 4. gpu_serve's forced variants after the
# two-context calibration (its trace lines).
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_quant_moe kernels-gen/compile_quant gpu_serve
# (specc as xz).
set -uo pipefail
BUDGET=${BUDGET:-540}
source scripts/device/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
OUT=$OUT bash scripts/device/suite.sh gpu_quant_moe:experts_match_interpreter > /tmp/suite.txt 2>&1
grep -E "^==|rc=|panicked|test result" /tmp/suite.txt | head -8 >> "$S"
OUT=$OUT bash scripts/device/suite.sh compile_quant:quantised_kernels_compile > /tmp/suite_c.txt 2>&1
grep -E "rc=|panicked|test result" /tmp/suite_c.txt | head -4 >> "$S"
grep -E "moe_grouped kimi (g[0-9][^ ]* )?T=(1|16) moe_(gate_up|down)" "$OUT/compile_quant.log" \
  | grep -E "sm_90a|sm_100a" | sed -E 's/ +/ /g' | cut -c1-100 | head -40 >> "$S"
grep -E "SPILL|spill bytes" "$OUT/compile_quant.log" | head -10 >> "$S"
echo "($(left)s left)" >> "$S"
TILINGS=g2d4u2-p,g2d4u1-p,g1d2u2-p,g2d8u1-p,g4d8u1-p,g1d4u4-p,g4d8u1
SPECC_KIMI_TOKENS=16,8,1 SPECC_KIMI_VARIANTS=int4g32,$TILINGS timeout 200 \
  .gpu2/tests/gpu_quant_moe --nocapture --test-threads=1 kimi_bandwidth > "$OUT/kimi_bw.log" 2>&1
echo "kimi_bandwidth rc=$? ($(left)s left)" >> "$S"
grep -E "identical to the first|panicked" "$OUT/kimi_bw.log" | cut -c1-160 | head -10 >> "$S"
sed -n '/BANDWIDTH TABLE/,$p' "$OUT/kimi_bw.log" | head -14 >> "$S"
# The fastest tiling at T = 1 (all four kernels' ms in the T = 1 column, the first).
best=$(sed -n '/BANDWIDTH TABLE/,$p' "$OUT/kimi_bw.log" | awk -F'|' 'NR > 2 && NF > 2 {
  split($2, a, " "); n = $1; gsub(/ +$/, "", n); sub(/^int4g32 ?/, "", n); if (n == "") n = "g2d4u2";
  if (best == "" || a[3] < t) { best = n; t = a[3] } } END { print best }')
echo "fastest at T = 1: ${best:-none}" >> "$S"
if [[ -n $best && $best != g2d4u2 ]]; then
  for round in 1 2; do
    for t in g2d4u2 "$best"; do
      (( $(left) > 70 )) || break
      for spec in "" "--tokens 8"; do
        r=$(SPECC_MOE_TILING=$t timeout 60 .gpu2/specc bench $KIMI --random-weights --layers 6 \
          --iters 30 --context 1024 $spec 2>&1 | grep -E "^\| (decode|verify)|rror" | head -1 | cut -c1-110)
        echo "kimi l6 $t $spec: $r" >> "$S"
      done
    done
  done
fi
if (( $(left) > 60 )); then
  SPECC_POLICY_TRACE=1 OUT=$OUT timeout $(( $(left) - 20 )) bash scripts/device/suite.sh \
    gpu_serve:forced_variants > /tmp/suite2.txt 2>&1
  grep -E "^==|rc=|panicked|test result" /tmp/suite2.txt | head -6 >> "$S"
  grep -h "calibrate" "$OUT"/gpu_serve.log | head -8 | cut -c1-160 >> "$S"
fi
echo "total $((SECONDS - start))s" >> "$S"
