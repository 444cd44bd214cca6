#!/usr/bin/env bash
# Session 44, call B: 8B verify(8) steps at B = 16 / 32 with the wgmma GEMM's column tiles
# widened by SPECC_WGMMA_MIN_BLOCKS against the default; the wgmma GEMM's tiles against the chosen one at the 8B shapes for
# 128, 256 and 512 rows (verify(8) at B = 16, 32, 64: where call A found specc behind
# compiled PyTorch), then, on an H200 only, the Kimi-K2.5 int4 verify of 8 and decode at
# ctx 1024 (issue 20's H200 figure). Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm
# (specc as xz).
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-330}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu" >> "$S"
# Whole verify(8) steps with wider wgmma column tiles on fewer blocks (o and down at 128 and
# 256 rows: 32 / 64 columns by default) against the default.
T=bench/configs/llama-3.1-8b/config.json
for b in ${BATCHES:-16 32}; do
  for mb in "" 48 24; do
    echo "== 8B verify(8) B=$b SPECC_WGMMA_MIN_BLOCKS=${mb:-default} ($(left)s left)" >> "$S"
    SPECC_WGMMA_MIN_BLOCKS=$mb timeout 40 .gpu2/specc bench $T --random-weights --iters 40 \
      --context 1024 --batch $b --tokens 8 > /tmp/v.txt 2>&1
    grep -E "^\| verify|rror" /tmp/v.txt | cut -c1-200 >> "$S"
  done
done
SPECC_TILE_SHAPES=${SHAPES:-o,qkv,down,gate_up} SPECC_TILE_ROWS=${ROWS:-128,256,512} \
  timeout $(( $(left) - $([[ $gpu == *H200* ]] && echo 100 || echo 10) )) .gpu2/tests/gpu_gemm --test-threads=1 --nocapture --ignored \
  --exact time_wgmma_tiles > "$OUT/wgmma_tiles.log" 2>&1
echo "tile sweep rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "^tiles|panicked" "$OUT/wgmma_tiles.log" | cut -c1-400 >> "$S"
if [[ $gpu == *H200* ]]; then
  KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30 --context 1024)
  for spec in "--tokens 8" ""; do
    (( $(left) > 30 )) || break
    echo "== Kimi-K2.5 int4 2 layers ctx 1024 $spec ($(left)s left)" >> "$S"
    timeout 45 .gpu2/specc "${KI[@]}" $spec > /tmp/k.txt 2>&1
    grep -E "^\| (decode|verify)|experts|rror" /tmp/k.txt | head -3 | cut -c1-200 >> "$S"
  done
fi
echo "total $((SECONDS - start))s" >> "$S"
