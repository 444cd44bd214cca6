#!/usr/bin/env bash
# Session 48, call A (H200 wanted), in order of what the session's choices need first:
# 1. the attention tiles against the interpreter, now each also with the combine folded into
#    the last split (`attention_tiles_fused`, bitwise equal to split + attn_combine, twice);
# 2. decode B = 1 with every one-row matmul on CUDA cores (SPECC_GEMV_ONE_ROW=cuda: the
#    lm-head's CUDA-core GEMV streams at 97 % of copy bandwidth on the H200, the tensor-core
#    gate/up at 72 %), and with 4 GEMV units in flight (SPECC_GEMV_UNROLL=4), alternating;
# 3. the fused combine (SPECC_ATTN_FUSED_COMBINE=1) at decode B = 1 / 32 and verify(8) B = 32;
# 4. the wgmma main loop with hoisted descriptors (SPECC_WGMMA_HOIST=1) and the K split's
#    reduce-scatter: bitwise tests, then verify(8) A/Bs at B = 16 / 32 / 64.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm kernels-gen/gpu_parity_attn (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-540}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
T=bench/configs/llama-3.1-8b/config.json
# ab VAR "VALUES" "bench args" LABEL: one bench line per value, in the order given.
ab() {
  local var=$1 vals=$2 args=$3 v r
  for v in $vals; do
    (( $(left) > 25 )) || return
    [[ $v == - ]] && v=""
    r=$(env "$var=$v" timeout 40 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 \
      $args 2>&1 | grep -E "^\| (decode|verify)|rror" | head -2 | cut -c1-110 | tr '\n' ' ')
    echo "$args $var=${v:-default}: $r" >> "$S"
  done
}
timeout 120 .gpu2/tests/gpu_parity_attn --test-threads=1 --nocapture attention_tile > "$OUT/attn.log" 2>&1
echo "gpu_parity_attn attention_tile* rc=$? fused passes=$(grep -c '^PASS fused' "$OUT/attn.log") ($((SECONDS - start))s)" >> "$S"
grep -E "panicked|test result" -A2 "$OUT/attn.log" | head -6 >> "$S"
ab SPECC_GEMV_ONE_ROW "- cuda - cuda" "--batch 1"
ab SPECC_GEMV_UNROLL "- 4 - 4" "--batch 1"
ab SPECC_ATTN_FUSED_COMBINE "- 1 - 1" "--batch 1"
ab SPECC_ATTN_FUSED_COMBINE "- 1 - 1" "--batch 32 --tokens 8"
ab SPECC_ATTN_FUSED_COMBINE "- 1" "--batch 32"
G=.gpu2/tests/gpu_gemm
timeout 100 $G --test-threads=1 --nocapture --exact gemm_wgmma_clusters_equal_the_unclustered_tile > "$OUT/clusters.log" 2>&1
echo "clusters_equal (with hoisted variants) rc=$? passes=$(grep -c ^PASS "$OUT/clusters.log") ($((SECONDS - start))s)" >> "$S"
grep -E "panicked" -A3 "$OUT/clusters.log" | head -5 >> "$S"
timeout 60 $G --test-threads=1 --nocapture --exact gemm_wgmma_split_k_every_split > "$OUT/split.log" 2>&1
echo "split_k_every_split (reduce-scatter) rc=$? passes=$(grep -c ^PASS "$OUT/split.log") ($((SECONDS - start))s)" >> "$S"
grep -E "panicked" -A3 "$OUT/split.log" | head -5 >> "$S"
ab SPECC_WGMMA_HOIST "- 1 - 1" "--batch 32 --tokens 8"
ab SPECC_WGMMA_SPLIT_K "- 1 - 1" "--batch 32 --tokens 8"
ab SPECC_WGMMA_SPLIT_K "- 1" "--batch 16 --tokens 8"
ab SPECC_WGMMA_HOIST "- 1" "--batch 64 --tokens 8"
echo "total $((SECONDS - start))s" >> "$S"
