#!/usr/bin/env bash
# Session 34, call E: decode on the tensor-core tiles and the last serving fixes. gpu_serve,
# attention parity (decode tiles), decode B = 32 (against PyTorch) and 64, the planted 8B
# sweep (plain, P = 0.6).
# Pack: scripts/gpu-pack --specc gpu_serve kernels-gen/gpu_parity_attn
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-285}
left() { echo $((BUDGET - (SECONDS - start))); }
T=bench/configs/llama-3.1-8b/config.json
bash scripts/device/suite.sh gpu_serve gpu_parity_attn 2>&1 | grep -vE "^test .* ok$" | grep -vE "uploading|^attention Attn|^rope_kv" | tail -12
grep -E "greedy twins|T=1|t: 1," "$OUT/gpu_serve.log" "$OUT/gpu_parity_attn.log" | cut -c1-260 | head -6
echo "== decode ($(left)s left)"
timeout 90 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 --batch 32 \
  --compare --torch-modes compile-layers 2>&1 | grep -E "^\| [a-z]"
timeout 40 .gpu2/specc bench $T --random-weights --iters 40 --context 1024 --batch 64 2>&1 | grep -E "^\| [a-z]"
if (( $(left) > 100 )); then
  LANES=16 MAX_CONTEXT=2048 REQUESTS=16 TOKENS=64 ACCEPT="0.6" CONC=1,4,16 \
    timeout $(( $(left) - 5 )) bash scripts/device/serve_sweep_accept.sh 8b 2>&1 | tail -5
fi
echo "total $((SECONDS - start))s"
