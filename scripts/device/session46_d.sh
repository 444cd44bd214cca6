#!/usr/bin/env bash
# Session 46, call D: gate/up as one m64n(2·bn) wgmma over both weight boxes, and clusters
# of 2 where the weight boxes outgrow x (choose::gemm::wgmma_cluster).
# 1. correctness: every cluster shape and the split form bitwise equal to the chosen tile;
#    the 8B epilogues against f64; row invariance;
# 2. whole 8B verify(8) at B = 32 / 64 (ctx 1024): default against SPECC_WGMMA_SPLIT_MATS=1,
#    alternating;
# 3. the tile sweep of gate/up at 256 / 512 rows (column tiles 112 and 128);
# 4. ncu (full set, source counters) of the chosen gate/up tile at 512 rows.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
export PATH=/usr/local/cuda/bin:$PATH
start=$SECONDS; BUDGET=${BUDGET:-420}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
G=.gpu2/tests/gpu_gemm
for t in gemm_wgmma_clusters_equal_the_unclustered_tile gemm_wgmma_8b_shapes_every_epilogue \
  gemm_wgmma_rows_do_not_depend_on_the_batch; do
  timeout 120 $G --test-threads=1 --nocapture --exact $t > /tmp/t.log 2>&1
  echo "$t rc=$? passes=$(grep -c ^PASS /tmp/t.log) ($((SECONDS - start))s)" >> "$S"
  grep -E "panicked|split_mats: true" -A3 /tmp/t.log | grep -v " 0 of " | head -5 >> "$S"
done
T=bench/configs/llama-3.1-8b/config.json
for b in 32 64; do
  for sp in "" 1 "" 1; do
    (( $(left) > 120 )) || break 2
    echo "== 8B verify(8) B=$b SPECC_WGMMA_SPLIT_MATS=${sp:-default} ($(left)s left)" >> "$S"
    SPECC_WGMMA_SPLIT_MATS=$sp timeout 40 .gpu2/specc bench $T --random-weights --iters 40 \
      --context 1024 --batch $b --tokens 8 > /tmp/v.txt 2>&1
    grep -E "^\| (verify|decode)|rror" /tmp/v.txt | cut -c1-200 >> "$S"
  done
done
SPECC_TILE_SHAPES=gate_up SPECC_TILE_ROWS=256,512 SPECC_TILE_BN=112,128 \
  timeout $(( $(left) > 140 ? 90 : $(left) - 50 )) $G --test-threads=1 --nocapture --ignored \
  --exact time_wgmma_tiles > /tmp/sw.log 2>&1
echo "tile sweep rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "^tiles|panicked" /tmp/sw.log | cut -c1-600 >> "$S"
if (( $(left) > 45 )); then
  r="$OUT/ncu_gate_up_512"
  SPECC_TILE_SHAPES=gate_up SPECC_TILE_ROWS=512 timeout $(( $(left) - 5 )) ncu --clock-control none \
    -k regex:gemm_wgmma --launch-count 1 --set full --import-source no -o "$r" \
    $G --test-threads=1 --nocapture --ignored --exact time_wgmma_tiles > /tmp/n.log 2>&1
  echo "ncu rc=$?" >> "$S"
  ncu -i "$r.ncu-rep" --page source --csv --print-source sass > "$r.src.csv" 2>&1
  ncu -i "$r.ncu-rep" --page details 2>&1 | grep -E "Duration|SM Frequency|Compute \(SM\)|L2 Cache Th|DRAM Th|L1/TEX Cache|Grid Size|Cluster Size|Registers|No Eligible" >> "$S"
  rm -f "$r.ncu-rep"
fi
echo "total $((SECONDS - start))s" >> "$S"
