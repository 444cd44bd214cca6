#!/usr/bin/env bash
# Session 45, call C: the 8B table of issue 22 with the final wgmma selection (64-row tiles
# for one matrix up to 256 rows; gate/up and 128 x 256 tiles from 4 row tiles as clusters
# sharing the weights): verify(8) at B = 16 / 32 / 64 and decode at B = 64 / 32, ctx 1024,
# each against compiled PyTorch layers under a graph in the same run; then the GEMM's 8B
# epilogue checks with the chosen tiles. Pack: scripts/gpu-pack --specc kernels-gen/gpu_gemm.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-400}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
T=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 32 --tokens 8" "--batch 64 --tokens 8" "--batch 16 --tokens 8" \
  "--batch 64" "--batch 32"; do
  (( $(left) > 60 )) || break
  echo "== 8B $spec ($(left)s left)" >> "$S"
  timeout 60 .gpu2/specc bench $T --random-weights --iters 40 \
    --context 1024 $spec --compare --torch-modes graph,compile-layers > /tmp/b.txt 2>&1
  grep -E "^\||torch|rror" /tmp/b.txt | grep -v "^|---" | cut -c1-220 | tail -6 >> "$S"
  cp /tmp/b.txt "$OUT/8b_${spec// /_}.txt"
done
t=gemm_wgmma_8b_shapes_every_epilogue
if (( $(left) > 80 )); then
  timeout $(( $(left) - 5 )) .gpu2/tests/gpu_gemm --test-threads=1 --nocapture --exact $t > "$OUT/$t.log" 2>&1
  echo "$t rc=$? passes=$(grep -c ^PASS "$OUT/$t.log") ($((SECONDS - start))s)" >> "$S"
  grep -E "panicked" -A3 "$OUT/$t.log" | head -5 >> "$S"
fi
echo "total $((SECONDS - start))s" >> "$S"
