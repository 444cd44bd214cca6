#!/usr/bin/env bash
# `specc serve` at the Llama-3.1-8B shape (random bf16 weights, no tokenizer: token-id
# prompts) against `specc bench-serve`, concurrency 1, 4, 16, 64, for plain decoding and for
# each spec given (bench/configs/*.toml, drafts with random weights: near-zero acceptance, the
# worst case for speculation). JSON per run in $OUT. Pack first: scripts/gpu-pack --specc
# Usage: bash scripts/device/serve_sweep_8b.sh none draft-1b-k7 ...   (LANES, REQUESTS, TOKENS,
# CONC, POLICY; SPECC_BIN another binary, TAG a prefix of the output names)
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Server logs stay out of $OUT: a device call brings back at most 8 files, and the JSON
# results must be among them.
LOGS=${LOGS:-/tmp/specc-serve-logs}; mkdir -p "$LOGS"
find .gpu2 -name '*.gz' -exec gunzip -kf {} \;
chmod +x .gpu2/specc .gpu2/specc_base 2>/dev/null
S=${SPECC_BIN:-.gpu2/specc}
LANES=${LANES:-16} REQUESTS=${REQUESTS:-32} TOKENS=${TOKENS:-64} CONC=${CONC:-1,4,16,64}
# 16 prompts of 32–95 token ids each (ids inside every Llama-3 vocabulary).
python3 -c '
import json, random
r = random.Random(7)
for i in range(16):
    print(json.dumps({"prompt": [r.randrange(1000, 100000) for _ in range(32 + 4 * i)]}))
' > /tmp/ids.jsonl
# Step graphs at batch 1, 4 and LANES; `--shrink-buckets` replays the smallest holding the
# lanes in use (a lone request runs at batch 1).
mkdir -p /tmp/specs
buckets="[1, 4, $LANES]"
for m in "$@"; do
  if [[ $m == none ]]; then
    printf 'method = "none"\nbatch_buckets = %s\n' "$buckets" > /tmp/specs/none.toml
  else
    sed -e '/^batch_buckets/d' -e "s|^draft = \"\(.*\)\"|draft = \"$PWD/bench/configs/\1\"|" \
      "bench/configs/$m.toml" > "/tmp/specs/$m.toml"
    echo "batch_buckets = $buckets" >> "/tmp/specs/$m.toml"
  fi
  flags=(--spec "/tmp/specs/$m.toml" --shrink-buckets)
  [[ $m == none ]] || flags+=(--spec-policy "${POLICY:-adaptive}")
  port=$((8100 + RANDOM % 500))
  $S serve bench/configs/llama-3.1-8b/config.json --random-weights --backend cuda \
    --lanes "$LANES" --max-context 2048 --port $port "${flags[@]}" > "$LOGS/serve8b_${TAG:-}$m.log" 2>&1 &
  pid=$!
  for i in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  echo "== sweep 8B $m (ready after ${i}s)"
  timeout 300 $S bench-serve --url "http://127.0.0.1:$port" --concurrency "$CONC" \
    --requests "$REQUESTS" --max-tokens "$TOKENS" --ignore-eos --prompts /tmp/ids.jsonl \
    --json "$OUT/sweep8b_${TAG:-}$m.json" 2>&1 | tail -7
  curl -s "http://127.0.0.1:$port/metrics" | grep -E "spec_decode_num_accepted|spec_decode_num_draft_tokens_total|variant" | head -6
  kill $pid; wait $pid 2>/dev/null
  tail -3 "$LOGS/serve8b_${TAG:-}$m.log"
done
