#!/usr/bin/env bash
# Adaptive speculation vs plain decoding on the CPU backend, embedded default, as paired
# samples: two resident `specc serve --lanes 16` servers (`--spec-policy adaptive` and
# `--no-spec`) benched in alternation by `specc bench-serve` (the order flips every pair), so
# a machine whose speed drifts over minutes moves both sides of a pair alike. Prints each
# pair's output tok/s and ratio, then the median ratio.
# Usage: [SPEC_POLICY=fixed] bench/cpu_adaptive_paired.sh [PAIRS] [REQUESTS] [CONCURRENCY] [SPECC] [PROMPTS]
set -euo pipefail
pairs=${1:-8}
requests=${2:-32}
concurrency=${3:-1}
bin=${4:-target/release/specc}
prompts=${5:-$(dirname "$0")/prompts/python.jsonl}
tmp=$(mktemp -d)
trap 'kill ${servers[@]:-} 2>/dev/null || true; rm -rf "$tmp"' EXIT

source "$(dirname "$0")/serve_start.sh"
servers=()


serve_start "$tmp/adaptive.log" --spec-policy "${SPEC_POLICY:-adaptive}"; servers+=("$server"); adaptive=$url
serve_start "$tmp/plain.log" --no-spec; servers+=("$server"); plain=$url
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores; concurrency $concurrency, $requests requests a sample"
ratios=()
for ((i = 0; i < pairs; i++)); do
  if ((i % 2 == 0)); then a=$(rate "$adaptive"); p=$(rate "$plain"); else p=$(rate "$plain"); a=$(rate "$adaptive"); fi
  r=$(awk -v a="$a" -v p="$p" 'BEGIN {printf "%.3f", a / p}')
  ratios+=("$r")
  echo "adaptive $a  plain $p  ratio $r"
done
printf '%s\n' "${ratios[@]}" | sort -g \
  | awk '{a[NR] = $1} END {m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "median adaptive / plain: %.3fx\n", m}'
