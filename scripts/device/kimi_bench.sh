#!/usr/bin/env bash
# The Kimi-K2-shaped bench on one H200 (issue 19 item 6): bf16 random weights, the first 2 of
# 61 layers (the dense layer 0 and one MoE layer of 384 experts), `.gpu2/specc` built with
# `scripts/gpu-pack --specc`. Usage: bash scripts/device/kimi_bench.sh [FIGURE...] where a
# figure is decode, verify, batch8, spec (default: all).
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
[[ -x .gpu2/specc ]] || { gunzip -kf .gpu2/specc.gz && chmod +x .gpu2/specc; }
K=(.gpu2/specc bench bench/configs/kimi-k2/config.json --random-weights --layers 2 --iters 30)
figs=${*:-decode verify batch8 spec}
for f in $figs; do
  case $f in
    decode)
      for ctx in 1024 8192; do echo "== decode B=1 ctx $ctx"; timeout 200 "${K[@]}" --context "$ctx" --per-kernel 2>&1 | grep -vE "^\| g|uploading"; done ;;
    verify)
      for t in 2 4 8 16; do echo "== verify T=$t B=1 ctx 1024"; timeout 200 "${K[@]}" --tokens "$t" 2>&1 | grep -vE "uploading"; done ;;
    batch8)
      echo "== decode B=8"; timeout 200 "${K[@]}" --batch 8 2>&1 | grep -v uploading
      echo "== verify T=8 B=8"; timeout 200 "${K[@]}" --batch 8 --tokens 8 2>&1 | grep -v uploading ;;
    spec)
      for s in eagle3-kimi-k3 dflash-kimi-b8 ddtree-kimi-b32; do echo "== $s B=1"; timeout 250 "${K[@]}" --spec "bench/configs/$s.toml" 2>&1 | grep -v uploading; done ;;
  esac
done
