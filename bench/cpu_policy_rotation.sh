#!/usr/bin/env bash
# Adaptive speculation against plain decoding and a fixed k = 1 on the CPU backend, embedded
# default: three resident `specc serve --lanes 16` servers (`--no-spec`, the default spec at
# k = 1 with `--spec-policy fixed`, the default adaptive) benched by `specc bench-serve` in
# rotation (each round starts with the next server), so a machine whose speed drifts over
# minutes moves all three alike. Prints each round's output tok/s and ratios, then medians.
# Usage: bench/cpu_policy_rotation.sh [ROUNDS] [REQUESTS] [CONCURRENCY] [SPECC] [PROMPTS]
set -euo pipefail
rounds=${1:-12}
requests=${2:-16}
concurrency=${3:-1}
bin=${4:-target/release/specc}
prompts=${5:-$(dirname "$0")/prompts/python.jsonl}
tmp=$(mktemp -d)
trap 'kill ${servers[@]:-} 2>/dev/null || true; rm -rf "$tmp"' EXIT

# The embedded default's files, extracted by any run.
"$bin" run --prompt x --max-tokens 1 >/dev/null 2>&1
default=$(ls -d "${SPECC_CACHE_DIR:-$HOME/.cache/specc}"/default-* | head -1)
printf 'method = "draft_model"\ntarget = "%s"\ndraft = "%s/draft"\nnum_steps = 1\n' \
  "$default" "$default" > "$tmp/k1.toml"

source "$(dirname "$0")/serve_start.sh"
servers=()
serve_start "$tmp/plain.log" --no-spec; servers+=("$server"); urls[0]=$url
serve_start "$tmp/k1.log" "$default" --spec "$tmp/k1.toml" --spec-policy fixed; servers+=("$server"); urls[1]=$url
serve_start "$tmp/adaptive.log" --spec-policy adaptive; servers+=("$server"); urls[2]=$url
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores; concurrency $concurrency, $requests requests a sample"
k1s=(); ads=()
for ((i = 0; i < rounds; i++)); do
  for j in 0 1 2; do s=$(((i + j) % 3)); r[s]=$(rate "${urls[s]}"); done
  k1=$(awk -v a="${r[1]}" -v p="${r[0]}" 'BEGIN {printf "%.3f", a / p}')
  ad=$(awk -v a="${r[2]}" -v p="${r[0]}" 'BEGIN {printf "%.3f", a / p}')
  k1s+=("$k1"); ads+=("$ad")
  echo "plain ${r[0]}  k=1 ${r[1]}  adaptive ${r[2]}  k=1/plain $k1  adaptive/plain $ad"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.3f", m}'; }
echo "median k=1 / plain: $(median "${k1s[@]}")x; adaptive / plain: $(median "${ads[@]}")x"
