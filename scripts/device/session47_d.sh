#!/usr/bin/env bash
# Session 47, call D (H200 wanted): the split-K kernel's correctness with the fixed tests, and
# the tensor-core GEMV's weight units in flight at up to 8 rows (SPECC_GEMV_UNROLL) on the
# 8B decode B = 1 / 8, verify(8) B = 1 and the Kimi-K2.5 int4 verify(8), alternating.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-300}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
G=.gpu2/tests/gpu_gemm
timeout 60 $G --test-threads=1 --nocapture --exact gemm_wgmma_split_k_every_split > "$OUT/split.log" 2>&1
echo "split_k_every_split rc=$? passes=$(grep -c ^PASS "$OUT/split.log")" >> "$S"
grep -E "panicked" -A3 "$OUT/split.log" | head -5 >> "$S"
T=bench/configs/llama-3.1-8b/config.json
run() {  # label, unroll, bench args...
  local u=$1; shift
  (( $(left) > 25 )) || return
  r=$(SPECC_GEMV_UNROLL=$u timeout 40 .gpu2/specc bench "$@" 2>&1 | grep -E "^\| (decode|verify)|rror" | head -2 | cut -c1-110 | tr '\n' ' ')
  echo "unroll=${u:-default} $*: $r" >> "$S"
}
for round in 1 2; do
  for u in "" 4; do run "$u" $T --random-weights --iters 40 --context 1024 --batch 1; done
done
for u in "" 8; do run "$u" $T --random-weights --iters 40 --context 1024 --batch 1 --tokens 8; done
for u in "" 8; do run "$u" bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30 --context 1024 --tokens 8; done
for u in "" 6; do run "$u" $T --random-weights --iters 40 --context 1024 --batch 1; done
echo "total $((SECONDS - start))s" >> "$S"
