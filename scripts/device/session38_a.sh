#!/usr/bin/env bash
# Session 38, call A: the fused MLA preparation kernels (`mla_kv_write`, `mla_q_split`) and
# the vector `head_matmul`
# against the unfused kernels and the interpreter, the DeepSeek-V3 engines against HF and
# exact through every method with them, Kimi-K2.5 int4 / Kimi-K2 bf16 steps base vs new in
# one call (per kernel for the new build), and Nsight Compute on `head_matmul` at Kimi's
# shapes (the next change). Output to $OUT/summary.txt as it runs; logs under /tmp.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_mla_prep kernels-gen/gpu_generic
# gpu_deepseek, HEAD~'s specc as .gpu2/specc_base.gz.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 60 .gpu2/tests/gpu_mla_prep --test-threads=1 --nocapture > /tmp/prep.log 2>&1
echo "gpu_mla_prep rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|PASS|outside" /tmp/prep.log | cut -c1-150 | head -40 >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
KB=(bench bench/configs/kimi-k2/config.json --random-weights --layers 2 --iters 30)
for spec in "" "--tokens 8" "--context 8192" "--tokens 16"; do
  for bin in specc_base specc; do
    (( $(left) > 330 )) || break
    echo "== Kimi-K2.5 int4 2 layers $spec $bin ($(left)s left)" >> "$S"
    pk=""; [[ $spec == "--tokens 8" ]] && pk="--per-kernel"
    timeout 60 .gpu2/$bin "${KI[@]}" $spec $pk > /tmp/k.txt 2>&1
    grep -E "^\| (decode|verify)" /tmp/k.txt | head -1 | cut -c1-150 >> "$S"
    [[ -n $pk ]] && grep -E "^\| " /tmp/k.txt | cut -c1-160 | head -90 > "$OUT/perkernel_int4_v8_$bin.txt"
  done
done
for bin in specc_base specc; do
  (( $(left) > 300 )) || break
  echo "== Kimi-K2 bf16 2 layers $bin ($(left)s left)" >> "$S"
  timeout 60 .gpu2/$bin "${KB[@]}" 2>&1 | grep -E "^\| (decode|verify)" | head -1 | cut -c1-150 >> "$S"
done
timeout $(( $(left) - 100 )) .gpu2/tests/gpu_deepseek --test-threads=1 > /tmp/deepseek.log 2>&1
echo "gpu_deepseek rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" /tmp/deepseek.log | head -8 >> "$S"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [[ -n $NCU ]] && (( $(left) > 60 )); then
  timeout $(( $(left) - 15 )) "$NCU" --clock-control none --kernel-name regex:head_matmul --launch-count 6 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section MemoryWorkloadAnalysis \
    .gpu2/tests/gpu_generic --test-threads=1 generic_ops_match_interpreter > /tmp/ncu_hm.txt 2>&1
  echo "ncu rc=$? ($((SECONDS - start))s)" >> "$S"
  grep -vE "^\s*$|^==PROF==|^PASS|^ok|^test " /tmp/ncu_hm.txt | cut -c1-150 | head -300 > "$OUT/ncu_head_matmul.txt"
fi
echo "total $((SECONDS - start))s" >> "$S"
