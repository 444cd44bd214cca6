#!/usr/bin/env bash
# Session 45, call A: where the sm_90a wgmma GEMM's time goes at verify row counts. ncu
# (full set, one launch) of the chosen tile for gate_up at 256 rows and o at 128 / 512 rows,
# and cuBLAS's time at the same shapes (scripts/device/torch_mm.py).
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm.
set -uo pipefail
source scripts/device/unpack.sh
export PATH=/usr/local/cuda/bin:$PATH
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 90 python3 scripts/device/torch_mm.py >> "$S" 2>&1
for sh in ${CASES:-gate_up:256 o:512 o:128}; do
  name=${sh%%:*}; rows=${sh##*:}; r="$OUT/ncu_${name}_$rows"
  SPECC_TILE_SHAPES=$name SPECC_TILE_ROWS=$rows timeout 150 ncu --clock-control none \
    -k regex:gemm_wgmma --launch-count 1 --set full -o "$r" \
    .gpu2/tests/gpu_gemm --test-threads=1 --nocapture --ignored --exact time_wgmma_tiles > "$r.log" 2>&1
  echo "ncu $name M=$rows rc=$?" >> "$S"
  ncu -i "$r.ncu-rep" --page details > "$r.txt" 2>&1
  ncu -i "$r.ncu-rep" --page source --csv --print-source sass > "$r.src.csv" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Executed Ipc A|Issue Slots Busy|No Eligible" "$r.txt" | head -12 >> "$S"
done
