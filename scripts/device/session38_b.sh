#!/usr/bin/env bash
# Session 38, call B (everything of this session in one call, most important first, while
# device time is scarce): the fused MLA kernels and the vector head_matmul against the
# unfused kernels / the interpreter; Kimi-K2.5 int4 steps base vs new (per kernel at
# verify(8)); the deferred drafter catch-up (gpu_serve: long plain stretches, forced variants,
# lanes joining) and zero-acceptance serving of the 8B EAGLE-3 engine against plain; the
# DeepSeek-V3 engines against HF and exact through every method; more Kimi steps.
# Logs under /tmp, only the summary and a few tables to $OUT (at most 8 files come back).
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_mla_prep kernels-gen/gpu_generic
# gpu_deepseek gpu_serve, 7fbc7d9's specc as .gpu2/specc_base.gz.
set -uo pipefail
REAL_OUT=${OUT:-/tmp/out}; mkdir -p "$REAL_OUT"
export OUT=/tmp/s38; mkdir -p "$OUT"
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-580}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$REAL_OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 60 .gpu2/tests/gpu_mla_prep --test-threads=1 --nocapture > /tmp/prep.log 2>&1
echo "gpu_mla_prep rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|PASS|outside" /tmp/prep.log | cut -c1-130 | head -24 >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
for spec in "--tokens 8" ""; do
  for bin in specc_base specc; do
    echo "== int4 2 layers $spec $bin ($(left)s left)" >> "$S"
    pk=""; [[ $spec == "--tokens 8" ]] && pk="--per-kernel"
    timeout 70 .gpu2/$bin "${KI[@]}" $spec $pk > /tmp/k.txt 2>&1
    grep -E "^\| (decode|verify)" /tmp/k.txt | head -1 | cut -c1-150 >> "$S"
    [[ -n $pk ]] && grep -E "^\| " /tmp/k.txt | cut -c1-150 | head -80 > "$REAL_OUT/pk_int4_v8_$bin.txt"
  done
done
timeout 150 .gpu2/tests/gpu_serve --test-threads=1 --nocapture long_plain forced_variants \
  > /tmp/serve.log 2>&1
echo "gpu_serve long_plain + forced_variants rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|catch-up" /tmp/serve.log | cut -c1-140 | head -16 >> "$S"
if (( $(left) > 250 )); then
  OUT=/tmp/s38/sweep CONC=1,4,16 REQUESTS=32 TAG=new_ timeout 200 \
    bash scripts/device/serve_sweep_8b.sh none eagle3-k7 >> /tmp/sweep.log 2>&1
  echo "zero-acceptance sweep rc=$? ($((SECONDS - start))s)" >> "$S"
  grep -vE "^\s*$" /tmp/sweep.log | cut -c1-160 | tail -30 >> "$S"
  tar czf "$REAL_OUT/sweep.tgz" -C /tmp/s38/sweep . 2>/dev/null
fi
if (( $(left) > 100 )); then
  timeout $(( $(left) - 40 )) .gpu2/tests/gpu_deepseek --test-threads=1 > /tmp/deepseek.log 2>&1
  echo "gpu_deepseek rc=$? ($((SECONDS - start))s)" >> "$S"
  grep -E "test result|panicked|FAIL" /tmp/deepseek.log | head -6 >> "$S"
fi
for spec in "--context 8192" "--tokens 16"; do
  for bin in specc_base specc; do
    (( $(left) > 25 )) || break
    echo "== int4 2 layers $spec $bin ($(left)s left)" >> "$S"
    timeout 25 .gpu2/$bin "${KI[@]}" $spec 2>&1 | grep -E "^\| (decode|verify)" | head -1 | cut -c1-150 >> "$S"
  done
done
echo "total $((SECONDS - start))s" >> "$S"
