#!/usr/bin/env bash
# Concurrency sweep (issue 22 item 5): `specc serve` against `specc bench-serve` at
# concurrency 1, 4, 16, 64 (output tok/s, TTFT, TPOT), plain decoding vs speculation, for
#   default: the embedded default (tiny trained target) with each trained drafter
#            (draft_model k = 5, EAGLE-3, DFlash, DDTree; the server's default policy);
#   8b:      the Llama-3.1-8B shape with --random-weights --synthetic-acceptance P (a planted
#            target and a draft of the same vocabulary (DRAFT: a 2-layer 512-wide one by
#            default, or the untied Llama-3.2-1B shape), draft_model k = 7, adaptive) at
#            P = 0.3 / 0.6 / 0.9 (ACCEPT), and plain decoding of the same planted target.
# JSON per run in $OUT (sweep_<shape>_<config>.json), then a table and an SVG per shape by
# bench/plot_sweep.py. Pack first: scripts/gpu-pack --specc
# Usage: bash scripts/device/serve_sweep_accept.sh [default] [8b]   (LANES, REQUESTS, TOKENS,
#        CONC, ACCEPT, MAX_CONTEXT, DEFAULT_METHODS, POLICY: adaptive or fixed). Split across calls, re-plot the fetched
#        JSON with bench/plot_sweep.py.
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Server logs stay out of $OUT: a device call brings back at most 8 files, and the JSON
# results must be among them.
LOGS=${LOGS:-/tmp/specc-serve-logs}; mkdir -p "$LOGS"
find .gpu2 -name '*.gz' -exec gunzip -kf {} \;
chmod +x .gpu2/specc 2>/dev/null
# SPECC / BACKEND: another binary and backend (a CPU smoke test of this script).
S=${SPECC:-.gpu2/specc} BACKEND=${BACKEND:-cuda}
LANES=${LANES:-16} REQUESTS=${REQUESTS:-64} TOKENS=${TOKENS:-128} CONC=${CONC:-1,4,16,64}
ACCEPT=${ACCEPT:-0.3 0.6 0.9}
# 16 lanes × 1024 tokens × 128 k vocabulary is the largest prefill chunk under 2^31 logits.
MAX_CONTEXT=${MAX_CONTEXT:-1024}
# 16 prompts of 32–95 token ids each (ids inside every Llama-3 vocabulary, no special id).
python3 -c '
import json, random
r = random.Random(7)
for i in range(16):
    print(json.dumps({"prompt": [r.randrange(1000, 100000) for _ in range(32 + 4 * i)]}))
' > /tmp/ids.jsonl
mkdir -p /tmp/specs
buckets="[1, 4, $LANES]"

# Serves with the given flags (after `serve`), sweeps, writes $OUT/sweep_$1.json.
measure() {
  local name=$1; shift
  local port=$((8100 + RANDOM % 500))
  $S serve --backend "$BACKEND" --lanes "$LANES" --port $port "$@" > "$LOGS/serve_$name.log" 2>&1 &
  local pid=$! i
  for i in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  echo "== sweep $name (ready after ${i}s)"
  timeout 400 $S bench-serve --url "http://127.0.0.1:$port" --concurrency "$CONC" \
    --requests "$REQUESTS" --max-tokens "$TOKENS" --ignore-eos "${PROMPTS[@]}" \
    --json "$OUT/sweep_$name.json" 2>&1 | tail -6
  curl -s "http://127.0.0.1:$port/metrics" | grep -E "spec_decode_num_accepted_tokens_total|spec_decode_num_draft_tokens_total|spec_variant_steps_total" | head -8
  kill $pid; wait $pid 2>/dev/null
  tail -2 "$LOGS/serve_$name.log"
}

shapes=("$@"); [[ ${#shapes[@]} -gt 0 ]] || shapes=(default 8b)
for shape in "${shapes[@]}"; do
  case $shape in
  default)
    D=$PWD/models/default
    PROMPTS=()
    printf 'method = "none"\ntarget = "%s"\nbatch_buckets = %s\n' "$D" "$buckets" > /tmp/specs/default_none.toml
    measure default_none --spec /tmp/specs/default_none.toml --shrink-buckets
    args=(plain="$OUT/sweep_default_none.json")
    # Each of the default's trained drafters (DEFAULT_METHODS: its spec files), the server's
    # default policy (adaptive where the method has variants).
    for m in ${DEFAULT_METHODS:-spec spec.eagle3 spec.dflash ddtree}; do
      sed -e '/^batch_buckets/d' -e "s|^target = \".\"|target = \"$D\"|" \
        -e "s|^draft = \"\(.*\)\"|draft = \"$D/\1\"|" "$D/$m.toml" > "/tmp/specs/default_$m.toml"
      echo "batch_buckets = $buckets" >> "/tmp/specs/default_$m.toml"
      measure "default_$m" --spec "/tmp/specs/default_$m.toml" --shrink-buckets
      case $m in
        spec) label="draft_model k=5" ;; spec.eagle3) label="EAGLE-3 k=5" ;;
        spec.dflash) label="DFlash block 8" ;; ddtree) label="DDTree budget 64" ;; *) label=$m ;;
      esac
      args+=("$label"="$OUT/sweep_default_$m.json")
    done
    python3 bench/plot_sweep.py --title "embedded default (trained), H200, $LANES lanes" \
      --svg "$OUT/sweep_default.svg" --md "$OUT/sweep_default.md" "${args[@]}"
    ;;
  8b)
    PROMPTS=(--prompts /tmp/ids.jsonl)
    T=bench/configs/llama-3.1-8b/config.json
    printf 'method = "none"\nbatch_buckets = %s\n' "$buckets" > /tmp/specs/8b_none.toml
    # DRAFT: bench/configs/llama-tiny-128k (2 layers, 512 wide: ≈ 2 % of a target step) by
    # default; llama-3.2-1b-untied for a 1B-shaped draft (≈ 38 % of a target step today).
    DRAFT=${DRAFT:-llama-tiny-128k}
    printf 'method = "draft_model"\ndraft = "%s"\nnum_steps = 7\nbatch_buckets = %s\n' \
      "$PWD/bench/configs/$DRAFT" "$buckets" > /tmp/specs/8b_draft.toml
    first=${ACCEPT%% *}
    # Plain decoding of the planted target (P changes no target weight).
    # SKIP_PLAIN=1: the plain run is kept from an earlier call (re-plot its JSON).
    [[ -n ${SKIP_PLAIN:-} ]] || measure 8b_none $T --random-weights --synthetic-acceptance "$first" \
      --max-context "$MAX_CONTEXT" --spec /tmp/specs/8b_none.toml --shrink-buckets
    args=(plain="$OUT/sweep_8b_none.json")
    for p in $ACCEPT; do
      measure "8b_p$p" $T --random-weights --synthetic-acceptance "$p" --max-context "$MAX_CONTEXT" \
        --spec /tmp/specs/8b_draft.toml --shrink-buckets --spec-policy "${POLICY:-adaptive}"
      args+=("draft_model ($DRAFT) k=7, P=$p"="$OUT/sweep_8b_p$p.json")
    done
    python3 bench/plot_sweep.py --title "Llama-3.1-8B shape, planted acceptance P, H200, $LANES lanes" \
      --svg "$OUT/sweep_8b.svg" --md "$OUT/sweep_8b.md" "${args[@]}"
    ;;
  *) echo "unknown shape $shape (default, 8b)"; exit 2 ;;
  esac
done
cat "$OUT"/sweep_*.md 2>/dev/null
