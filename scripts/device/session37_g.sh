#!/usr/bin/env bash
# Session 37, call G: `mla_tile` with 8 warps a row tile and 64-slot tiles where the latent
# and shared memory take them (two warps a scheduler at one decode token): parity against the
# interpreter at both warp counts, bucket invariance, the tile / combine split, the split x
# rows x warps x stages sweep, Nsight Compute at B = 1, T = 1, then the Kimi-K2.5 int4 and
# Kimi-K2 bf16 steps against call F's build. Output to $OUT/summary.txt.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla, the previous build's specc as
# .gpu2/specc_base.gz.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-300}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
timeout 100 .gpu2/tests/gpu_parity_mla --test-threads=1 --nocapture > /tmp/parity_mla.log 2>&1
echo "gpu_parity_mla rc=$? ($((SECONDS - start))s)" >> "$S"
grep -E "test result|panicked|FAIL" /tmp/parity_mla.log | head -5 >> "$S"
grep -cE "PASS" /tmp/parity_mla.log >> "$S"
grep -E "PASS kimi (B=1 T=1 ctx=8192|B=1 T=8 ctx=8192)" /tmp/parity_mla.log | cut -c1-140 >> "$S"
timeout 40 .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "kimi B|panicked" >> "$S"
timeout 100 .gpu2/tests/gpu_parity_mla mla_tile_split_sweep --ignored --nocapture --test-threads=1 \
  2>&1 | grep -E "SWEEP|panicked" | sed 's/SWEEP kimi //' > /tmp/sweep.txt
sort -t: -k1,1 -s /tmp/sweep.txt | awk '{print}' >> "$S"
timeout 60 /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:mla_tile --launch-skip 2 \
  --launch-count 1 --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
  .gpu2/tests/gpu_parity_mla mla_tile_timings --ignored --test-threads=1 \
  2>&1 | grep -E "Duration|Elapsed Cycles|Issued Warp|Warp Cycles Per Issued|Active Warps Per" | cut -c1-140 >> "$S"
KI=(bench bench/configs/kimi-k2-int4/config.json --random-weights --layers 2 --iters 30)
KB=(bench bench/configs/kimi-k2/config.json --random-weights --layers 2 --iters 30)
for spec in "--context 8192" "--context 8192 --tokens 4" "--tokens 8" "--tokens 2"; do
  for bin in specc_base specc; do
    (( $(left) > 30 )) || break
    echo "== Kimi-K2.5 int4 2 layers $spec $bin ($(left)s left)" >> "$S"
    timeout 60 .gpu2/$bin "${KI[@]}" $spec --per-kernel > /tmp/k.txt 2>&1
    grep -E "^\| (decode|verify)" /tmp/k.txt | head -1 | cut -c1-150 >> "$S"
    grep -E "^\| mla_attention " /tmp/k.txt | cut -c1-120 | head -1 >> "$S"
  done
done
for bin in specc_base specc; do
  (( $(left) > 30 )) || break
  echo "== Kimi-K2 bf16 2 layers ctx 8192 $bin ($(left)s left)" >> "$S"
  timeout 60 .gpu2/$bin "${KB[@]}" --context 8192 2>&1 | grep -E "^\| (decode|verify)" | head -1 | cut -c1-150 >> "$S"
done
echo "total $((SECONDS - start))s" >> "$S"
