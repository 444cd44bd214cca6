#!/usr/bin/env bash
# The concurrency sweep of scripts/device/serve_sweep_accept.sh on the CPU backend, small:
# `specc serve --lanes 16` against `specc bench-serve --concurrency 1,4,16` for
#   default: the embedded default, plain (--no-spec) vs its trained draft k = 5 (adaptive);
#   planted: a small untied Llama (hidden 256, 4 layers, vocab 4096; draft hidden 128,
#            2 layers) with --random-weights --synthetic-acceptance P, plain vs draft_model
#            k = 4 (adaptive) at P = 0.3 / 0.6 / 0.9.
# JSON per run, a markdown table and an SVG per family (bench/plot_sweep.py) in OUTDIR.
# Usage: bench/cpu_sweep.sh OUTDIR [SPECC] [REQUESTS] [MAX_TOKENS]
set -euo pipefail
out=${1:?usage: bench/cpu_sweep.sh OUTDIR [SPECC] [REQUESTS] [MAX_TOKENS]}
bin=${2:-target/release/specc}
requests=${3:-16}
max_tokens=${4:-64}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$tmp"' EXIT

# Serves with the given flags (after `serve`) and writes $out/sweep_$1.json.
measure() {
  local name=$1; shift
  "$bin" serve --port 0 --lanes 16 "$@" 2>"$tmp/serve.log" &
  server=$!
  local url=""
  for _ in $(seq 1200); do
    url=$(sed -n 's/.* on \(http:\/\/[0-9.:]*\).*/\1/p' "$tmp/serve.log" | head -1)
    [[ -n $url ]] && break
    sleep 0.1
  done
  [[ -n $url ]] || { cat "$tmp/serve.log" >&2; exit 1; }
  "$bin" bench-serve --url "$url" --concurrency 1,4,16 --requests "$requests" \
    --max-tokens "$max_tokens" --ignore-eos "${prompts[@]}" --json "$out/sweep_$name.json" >/dev/null
  echo "$name: $(curl -s "$url/metrics" | grep -E '^specc:spec_variant_steps_total' | tr '\n' ' ')"
  kill "$server"
  wait "$server" 2>/dev/null || true
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
prompts=()
measure default_none --no-spec
measure default_draft-k5 --spec-policy adaptive
python3 bench/plot_sweep.py --title "embedded default (trained), CPU backend, 16 lanes" \
  --svg "$out/sweep_cpu_default.svg" --md "$out/sweep_cpu_default.md" \
  plain="$out/sweep_default_none.json" "draft_model k=5 (adaptive)"="$out/sweep_default_draft-k5.json"

# The planted family: token-id prompts (the configs have no tokenizer).
llama() {
  mkdir -p "$tmp/$1"
  cat > "$tmp/$1/config.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "hidden_size": $2, "intermediate_size": $((2 * $2)),
 "num_attention_heads": $(($2 / 64)), "num_key_value_heads": 1, "head_dim": 64,
 "num_hidden_layers": $3, "vocab_size": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
 "max_position_embeddings": 1024, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
 "bos_token_id": 0, "eos_token_id": 1}
EOF
}
llama target 256 4
llama draft 128 2
printf 'method = "draft_model"\ndraft = "%s"\nnum_steps = 4\nmax_context = 512\n' "$tmp/draft" > "$tmp/spec.toml"
python3 -c '
import json, random
r = random.Random(7)
for i in range(16):
    print(json.dumps({"prompt": [r.randrange(2, 4096) for _ in range(8 + 2 * i)]}))
' > "$tmp/ids.jsonl"
prompts=(--prompts "$tmp/ids.jsonl")
measure planted_none "$tmp/target/config.json" --random-weights --synthetic-acceptance 0.3 --max-context 512
args=(plain="$out/sweep_planted_none.json")
for p in 0.3 0.6 0.9; do
  measure "planted_p$p" "$tmp/target/config.json" --random-weights --synthetic-acceptance "$p" \
    --spec "$tmp/spec.toml" --spec-policy adaptive
  args+=("draft_model k=4, P=$p"="$out/sweep_planted_p$p.json")
done
python3 bench/plot_sweep.py --title "planted acceptance P (H 256, 4 layers), CPU backend" \
  --svg "$out/sweep_cpu_planted.svg" --md "$out/sweep_cpu_planted.md" "${args[@]}"
