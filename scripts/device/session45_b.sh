#!/usr/bin/env bash
# Session 45, call B: the wgmma GEMM as thread-block clusters sharing a box by TMA multicast.
# 1. correctness: every cluster shape bitwise equal to the unclustered tile; the 8B shapes'
#    epilogues against the f64 reference with the chosen (clustered) tiles; row invariance.
# 2. whole 8B steps (ctx 1024) with clusters (default) and without (SPECC_WGMMA_CLUSTER=0).
# 3. the tile sweep (chosen, cluster shapes, other tiles) at 128 / 256 / 512 rows.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-420}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
G=.gpu2/tests/gpu_gemm
timeout 100 $G --test-threads=1 --nocapture --exact gemm_wgmma_clusters_equal_the_unclustered_tile > "$OUT/clusters.log" 2>&1
echo "clusters test rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "^PASS|panicked|differ" "$OUT/clusters.log" | grep -v " 0 of " | tail -4 >> "$S"
T=bench/configs/llama-3.1-8b/config.json
for run in ${RUNS:-"16 8" "32 8" "64 8" "64 1" "32 1"}; do
  set -- $run; b=$1; tok=$2
  for cl in "" 0; do
    (( $(left) > 150 )) || break 2
    echo "== 8B tokens=$tok B=$b SPECC_WGMMA_CLUSTER=${cl:-default} ($(left)s left)" >> "$S"
    SPECC_WGMMA_CLUSTER=$cl timeout 40 .gpu2/specc bench $T --random-weights --iters 40 \
      --context 1024 --batch $b --tokens $tok > /tmp/v.txt 2>&1
    grep -E "^\| (verify|decode)|rror" /tmp/v.txt | cut -c1-200 >> "$S"
  done
done
SPECC_TILE_SHAPES=${SHAPES:-o,qkv,down,gate_up} SPECC_TILE_ROWS=${ROWS:-128,256,512} \
  timeout $(( $(left) - 60 )) $G --test-threads=1 --nocapture --ignored \
  --exact time_wgmma_tiles > "$OUT/wgmma_tiles.log" 2>&1
echo "tile sweep rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "^tiles|panicked" "$OUT/wgmma_tiles.log" | cut -c1-600 >> "$S"
for t in gemm_wgmma_8b_shapes_every_epilogue gemm_wgmma_rows_do_not_depend_on_the_batch gemm_wgmma_odd_shapes; do
  (( $(left) > 15 )) || break
  timeout $(( $(left) - 5 )) $G --test-threads=1 --nocapture --exact $t > "$OUT/$t.log" 2>&1
  echo "$t rc=$? passes=$(grep -c ^PASS "$OUT/$t.log") ($((SECONDS - start))s)" >> "$S"
  grep -E "panicked" -A3 "$OUT/$t.log" | head -5 >> "$S"
done
echo "total $((SECONDS - start))s" >> "$S"
