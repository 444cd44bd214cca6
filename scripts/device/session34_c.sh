#!/usr/bin/env bash
# Session 34, call C: greedy twins and the decode splits on the device. gpu_serve (twins
# exact, every earlier serving test), attention parity at odd split counts, decode B = 8 /
# 32 / 64 whole steps (B = 32 against PyTorch in the same call), the planted 8B sweep
# (plain and P = 0.6, twins on the serving engine), 16 lanes × 3000-token prompts with a
# whole-prompt prefill (clamped to one launch's rows).
# Pack: scripts/gpu-pack --specc gpu_serve kernels-gen/gpu_parity_attn
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
S=.gpu2/specc
T=bench/configs/llama-3.1-8b/config.json
bash scripts/device/suite.sh gpu_serve gpu_parity_attn 2>&1 | grep -vE "^test .* ok$"
grep -E "greedy twins|mixed lanes" "$OUT/gpu_serve.log"
echo "== decode steps ($(left)s left)"
for b in 8 64; do
  timeout 100 $S bench $T --random-weights --iters 40 --context 1024 --batch $b 2>&1 | grep -E "^\| [a-z]"
done
timeout 150 $S bench $T --random-weights --iters 40 --context 1024 --batch 32 \
  --compare --torch-modes graph,compile-layers 2>&1 | grep -E "^\||torch" | grep -v "^|---" | tail -6
if (( $(left) > 200 )); then
  echo "== planted sweep ($(left)s left)"
  LANES=16 MAX_CONTEXT=2048 REQUESTS=16 TOKENS=64 ACCEPT="0.6" SPECC_POLICY_TRACE=1 \
    timeout $(( $(left) - 70 )) bash scripts/device/serve_sweep_accept.sh 8b 2>&1 | grep -vE "pick k=" | tail -30
  grep -hE "calibrate" "$OUT"/serve_8b_*.log 2>/dev/null | head -12
fi
python3 -c '
import json, random
r = random.Random(7)
for i in range(16):
    n = 3000 if i % 4 == 3 else 64
    print(json.dumps({"prompt": [r.randrange(1000, 100000) for _ in range(n)]}))
' > /tmp/long.jsonl
printf 'method = "none"\nbatch_buckets = [1, 4, 16]\n' > /tmp/none.toml
if (( $(left) > 45 )); then
  port=$((8100 + RANDOM % 500))
  $S serve $T --random-weights --backend cuda --lanes 16 --max-context 4096 --port $port \
    --spec /tmp/none.toml --shrink-buckets --prefill-chunk 0 > "$OUT/serve_long_0.log" 2>&1 &
  pid=$!
  for i in $(seq 1 60); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 1; done
  echo "== long prompts, --prefill-chunk 0 ($(left)s left)"
  grep -E "serving" "$OUT/serve_long_0.log" | cut -c1-300
  timeout $(( $(left) - 5 )) $S bench-serve --url "http://127.0.0.1:$port" --concurrency 16 --requests 16 \
    --max-tokens 32 --ignore-eos --prompts /tmp/long.jsonl --json "$OUT/long_0.json" 2>&1 | tail -3
  kill $pid; wait $pid 2>/dev/null
fi
echo "total $((SECONDS - start))s"
