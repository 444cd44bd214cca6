#!/usr/bin/env bash
# Session 34, call B: decode / verify(8) attention of 1–64 sequences at every context split
# (`kernel_bench batch_splits`), and the inter-token latency of 8B serving while prompts of
# 3000 tokens join (chunked vs whole prefill).
# Pack: scripts/gpu-pack --specc; cargo build --release -p specc-kernels-gen --features cuda
#   --example kernel_bench; strip + gzip it to .gpu2/kernel_bench.gz
set -uo pipefail
source scripts/device/unpack.sh
gunzip -kf .gpu2/kernel_bench.gz; chmod +x .gpu2/kernel_bench
start=$SECONDS; BUDGET=${BUDGET:-420}
left() { echo $((BUDGET - (SECONDS - start))); }
S=.gpu2/specc
T=bench/configs/llama-3.1-8b/config.json
echo "== kernel_bench batch_splits"
timeout 200 .gpu2/kernel_bench batch_splits > "$OUT/batch_splits.log" 2>&1; echo "rc=$?"
grep -E "attn_|device" "$OUT/batch_splits.log"
# 16 prompts: every fourth 3000 token ids, the others 64.
python3 -c '
import json, random
r = random.Random(7)
for i in range(16):
    n = 3000 if i % 4 == 3 else 64
    print(json.dumps({"prompt": [r.randrange(1000, 100000) for _ in range(n)]}))
' > /tmp/long.jsonl
printf 'method = "none"\nbatch_buckets = [1, 4, 16]\n' > /tmp/none.toml
for chunk in 512 0; do
  (( $(left) > 80 )) || break
  port=$((8100 + RANDOM % 500))
  $S serve $T --random-weights --backend cuda --lanes 16 --max-context 4096 --port $port \
    --spec /tmp/none.toml --shrink-buckets --prefill-chunk $chunk > "$OUT/serve_long_$chunk.log" 2>&1 &
  pid=$!
  for i in $(seq 1 150); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 1; done
  echo "== long prompts, --prefill-chunk $chunk (ready after ${i}s, $(left)s left)"
  tail -2 "$OUT/serve_long_$chunk.log" | cut -c1-300
  timeout 100 $S bench-serve --url "http://127.0.0.1:$port" --concurrency 16 --requests 32 \
    --max-tokens 64 --ignore-eos --prompts /tmp/long.jsonl --json "$OUT/long_$chunk.json" 2>&1 | tail -4
  kill $pid; wait $pid 2>/dev/null
done
echo "total $((SECONDS - start))s"
