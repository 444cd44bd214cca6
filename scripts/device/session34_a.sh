#!/usr/bin/env bash
# Session 34, call A: where decode at B = 32 / 64 spends its time (per-kernel tables), the
# serving engine's sampled planted step against the greedy one (per-kernel), the inter-token
# latency of live lanes while long prompts join (chunked vs whole prefill), DDTree serving.
# Pack: scripts/gpu-pack --specc
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-540}
left() { echo $((BUDGET - (SECONDS - start))); }
S=.gpu2/specc
T=bench/configs/llama-3.1-8b/config.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for b in 32 64; do
  echo "== decode B=$b per-kernel ($(left)s left)"
  timeout 120 $S bench $T --random-weights --iters 20 --context 1024 --batch $b --per-kernel \
    > "$OUT/perkernel_decode_b$b.log" 2>&1; echo "rc=$?"
  grep -E "^\| |^[A-Za-z]" "$OUT/perkernel_decode_b$b.log" | grep -v "^|---" | head -45
done
mkdir -p /tmp/specs
sed -e "s|^draft = \"\(.*\)\"|draft = \"$PWD/bench/configs/\1\"|" bench/configs/draft-1b-untied-k7.toml > /tmp/specs/greedy.toml
{ cat /tmp/specs/greedy.toml; printf '\n[acceptance]\nmode = "sample"\n'; } > /tmp/specs/sample.toml
for a in greedy sample; do
  (( $(left) > 200 )) || break
  echo "== planted k=7 step B=1, $a acceptance, per-kernel ($(left)s left)"
  timeout 150 $S bench $T --random-weights --synthetic-acceptance 0.6 --spec /tmp/specs/$a.toml \
    --iters 20 --context 1024 --per-kernel > "$OUT/perkernel_step_$a.log" 2>&1; echo "rc=$?"
  grep -E "^\| |^[A-Za-z]" "$OUT/perkernel_step_$a.log" | grep -v "^|---" | head -40
done
# 16 prompts: every fourth 3000 token ids, the others 64.
python3 -c '
import json, random
r = random.Random(7)
for i in range(16):
    n = 3000 if i % 4 == 3 else 64
    print(json.dumps({"prompt": [r.randrange(1000, 100000) for _ in range(n)]}))
' > /tmp/long.jsonl
for chunk in 512 0; do
  (( $(left) > 100 )) || break
  port=$((8100 + RANDOM % 500))
  $S serve $T --random-weights --backend cuda --lanes 16 --max-context 4096 --port $port \
    --prefill-chunk $chunk > "$OUT/serve_long_$chunk.log" 2>&1 &
  pid=$!
  for i in $(seq 1 200); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  echo "== long prompts, --prefill-chunk $chunk (ready after ${i}s, $(left)s left)"
  timeout 120 $S bench-serve --url "http://127.0.0.1:$port" --concurrency 16 --requests 32 \
    --max-tokens 64 --ignore-eos --prompts /tmp/long.jsonl --json "$OUT/long_$chunk.json" 2>&1 | tail -4
  kill $pid; wait $pid 2>/dev/null
done
if (( $(left) > 120 )); then
  echo "== DDTree b32 serving sweep ($(left)s left)"
  REQUESTS=16 timeout $(( $(left) - 5 )) bash scripts/device/serve_sweep_8b.sh ddtree-b32 2>&1 | tail -14
fi
echo "total $((SECONDS - start))s"
