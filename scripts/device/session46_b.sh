#!/usr/bin/env bash
# Session 46, call B: Nsight Compute (full set, one launch each) of cuBLAS's kernel and
# gemm_wgmma's chosen tile at the same shapes and rows (default gate_up and o at 512 rows),
# side by side: what cuBLAS's main loop gets that ours does not. Pack: scripts/gpu-pack
# --specc kernels-gen/gpu_gemm.
set -uo pipefail
source scripts/device/unpack.sh
export PATH=/usr/local/cuda/bin:$PATH
S="$OUT/summary.txt"
[ -s "$S" ] || nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
KEYS="Duration|SM Frequency|Compute \(SM\) Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Grid Size|Block Size|Cluster Size|Registers Per|Dynamic Shared|Waves Per SM|L2 Hit Rate|Issue Slots Busy|No Eligible|Mem Pipes Busy"
for sh in ${CASES:-gate_up:512 o:512}; do
  name=${sh%%:*}; rows=${sh##*:}
  r="$OUT/ncu_cublas_${name}_$rows"
  timeout 150 ncu --clock-control none -k regex:'nvjet|sm90|gemm|cutlass' --launch-skip 5 --launch-count 1 \
    --set full -o "$r" python3 scripts/device/one_mm.py $name $rows > "$r.log" 2>&1
  echo "== cuBLAS $name M=$rows rc=$?" >> "$S"
  ncu -i "$r.ncu-rep" --page details > "$r.txt" 2>&1
  grep -E "^  [a-z_]" "$r.txt" | head -2 | cut -c1-200 >> "$S"
  grep -E "$KEYS" "$r.txt" | head -24 >> "$S"
  r="$OUT/ncu_specc_${name}_$rows"
  SPECC_TILE_SHAPES=$name SPECC_TILE_ROWS=$rows timeout 150 ncu --clock-control none \
    -k regex:gemm_wgmma --launch-count 1 --set full -o "$r" \
    .gpu2/tests/gpu_gemm --test-threads=1 --nocapture --ignored --exact time_wgmma_tiles > "$r.log" 2>&1
  echo "== specc $name M=$rows rc=$?" >> "$S"
  ncu -i "$r.ncu-rep" --page details > "$r.txt" 2>&1
  grep -E "$KEYS" "$r.txt" | head -24 >> "$S"
done
