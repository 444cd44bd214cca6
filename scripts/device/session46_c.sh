#!/usr/bin/env bash
# Session 46, call C: wgmma column tiles by waves (choose::gemm::wave_columns).
# 1. correctness of the new tiles: the 8B shapes' epilogues against the f64 reference with
#    the chosen tiles, odd shapes, row invariance;
# 2. whole 8B verify(8) at B = 16 / 32 / 64 (ctx 1024), default against SPECC_WGMMA_WAVES=0,
#    alternating;
# 3. the tile sweep of q|k|v and gate/up at 128 / 256 / 512 rows over column tiles
#    96 / 112 / 128 / 192 (SPECC_TILE_BN) beside the chosen tile;
# 4. with what is left, session46_b.sh (ncu of cuBLAS and gemm_wgmma side by side).
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
G=.gpu2/tests/gpu_gemm
for t in gemm_wgmma_8b_shapes_every_epilogue gemm_wgmma_rows_do_not_depend_on_the_batch; do
  timeout 120 $G --test-threads=1 --nocapture --exact $t > "$OUT/$t.log" 2>&1
  echo "$t rc=$? passes=$(grep -c ^PASS "$OUT/$t.log") ($((SECONDS - start))s)" >> "$S"
  grep -E "panicked" -A3 "$OUT/$t.log" | head -5 >> "$S"
done
T=bench/configs/llama-3.1-8b/config.json
for b in 32 64 16; do
  for wv in "" 0 "" 0; do
    (( $(left) > 200 )) || break 2
    echo "== 8B verify(8) B=$b SPECC_WGMMA_WAVES=${wv:-default} ($(left)s left)" >> "$S"
    SPECC_WGMMA_WAVES=$wv timeout 40 .gpu2/specc bench $T --random-weights --iters 40 \
      --context 1024 --batch $b --tokens 8 > /tmp/v.txt 2>&1
    grep -E "^\| (verify|decode)|rror" /tmp/v.txt | cut -c1-200 >> "$S"
  done
done
SPECC_TILE_SHAPES=qkv,gate_up SPECC_TILE_ROWS=128,256,512 SPECC_TILE_BN=96,112,128,192 \
  timeout $(( $(left) - 100 )) $G --test-threads=1 --nocapture --ignored \
  --exact time_wgmma_tiles > "$OUT/wgmma_tiles.log" 2>&1
echo "tile sweep rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "^tiles|panicked" "$OUT/wgmma_tiles.log" | cut -c1-600 >> "$S"
t=gemm_wgmma_odd_shapes
timeout 60 $G --test-threads=1 --nocapture --exact $t > "$OUT/$t.log" 2>&1
echo "$t rc=$? passes=$(grep -c ^PASS "$OUT/$t.log") ($((SECONDS - start))s)" >> "$S"
grep -E "panicked" -A3 "$OUT/$t.log" | head -5 >> "$S"
if (( $(left) > 60 )); then
  CASES="gate_up:512" timeout $(( $(left) - 5 )) bash scripts/device/session46_b.sh
fi
echo "total $((SECONDS - start))s" >> "$S"
