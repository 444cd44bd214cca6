#!/usr/bin/env bash
# Speculative vs plain decoding on the CPU backend, embedded default: N back-to-back pairs
# (speculative first, then --no-spec, same prompt, greedy), then the medians of the tok/s
# the CLI prints. Usage: bench/cpu_spec_vs_plain.sh [N] [SPECC] [extra run args...]
set -euo pipefail
n=${1:-5}
bin=${2:-target/release/specc}
shift $(( $# < 2 ? $# : 2 ))
args=(run --prompt "def __init__(self" --max-tokens 200 "$@")
rate() { "$bin" "${args[@]}" "$@" 2>&1 | sed -n 's/.*(\([0-9.]*\) tok\/s).*/\1/p'; }
spec=() plain=()
for ((i = 0; i < n; i++)); do
  spec+=("$(rate)")
  plain+=("$(rate --no-spec)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
ms=$(median "${spec[@]}") mp=$(median "${plain[@]}")
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "speculative tok/s: ${spec[*]} (median $ms)"
echo "--no-spec    tok/s: ${plain[*]} (median $mp)"
awk -v s="$ms" -v p="$mp" 'BEGIN {printf "speculative / plain: %.2fx\n", s / p}'
