#!/usr/bin/env bash
# Adaptive speculation vs plain decoding under load on the CPU backend, embedded default:
# `specc serve --lanes 16` with `--spec-policy adaptive` (the draft_model k = 5 engine and its
# variants k = 0, 1, 3) and with `--no-spec`, each measured by `specc bench-serve` at
# concurrency 1 and 16 (greedy, --ignore-eos), then the output tok/s ratios. The prompts are
# Python source openings (bench/prompts/python.jsonl): the default is trained on Python code,
# and bench-serve's built-in English instructions are outside its domain.
# Usage: bench/cpu_adaptive_serve.sh [REQUESTS] [SPECC] [MAX_TOKENS] [PROMPTS]
set -euo pipefail
requests=${1:-16}
bin=${2:-target/release/specc}
max_tokens=${3:-128}
prompts=${4:-$(dirname "$0")/prompts/python.jsonl}
tmp=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/serve_start.sh"

# Serves with the given flags, benches concurrency 1 and 16; prints "c1 c16" output tok/s.
measure() {
  serve_start "$tmp/serve.log" "$@"
  "$bin" bench-serve --url "$url" --concurrency 1,16 --requests "$requests" \
    --max-tokens "$max_tokens" --prompts "$prompts" --ignore-eos --json "$tmp/out.json" >/dev/null
  curl -s "$url/metrics" | grep '^specc:spec_variant_steps_total' | sed 's/^/  /' >&2 || true
  kill "$server"
  wait "$server" 2>/dev/null || true
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join("%.1f" % r["output_tok_s"] for r in d))' "$tmp/out.json"
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
read -r a1 a16 < <(measure --spec-policy adaptive)
read -r p1 p16 < <(measure --no-spec)
echo "adaptive   output tok/s: c1 $a1, c16 $a16"
echo "--no-spec  output tok/s: c1 $p1, c16 $p16"
awk -v a="$a1" -v p="$p1" -v b="$a16" -v q="$p16" \
  'BEGIN {printf "adaptive / plain: c1 %.2fx, c16 %.2fx\n", a / p, b / q}'
