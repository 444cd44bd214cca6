# Sourced by the device scripts from session 49 on: the setup and the measurements they share.
# After sourcing: $OUT is a scratch folder whose summary.txt and a details.tgz of everything
# else come back (a call brings back at most 8 files), `left` prints the seconds left of
# $BUDGET, and $S is the summary file.
source scripts/device/unpack.sh
if [[ -z ${SPECC_LIB_OUT:-} ]]; then
  export SPECC_LIB_OUT=$OUT
  OUT=/tmp/o; mkdir -p "$OUT"; export OUT
  trap 'cp "$OUT/summary.txt" "$SPECC_LIB_OUT/"; tar czf "$SPECC_LIB_OUT/details.tgz" -C "$OUT" .' EXIT
fi
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
S="$OUT/summary.txt"
T8B=bench/configs/llama-3.1-8b/config.json
KIMI=bench/configs/kimi-k2-int4/config.json

# table_8b SPEC...: each `specc bench` spec of the 8B shape against compiled PyTorch layers
# in the same run (issue 22's table), while more than 45 s are left.
table_8b() {
  local spec
  for spec in "$@"; do
    (( $(left) > 45 )) || break
    echo "== 8B $spec ($(left)s left)" >> "$S"
    timeout $(( $(left) > 70 ? 60 : $(left) - 10 )) .gpu2/specc bench $T8B --random-weights \
      --iters 40 --context 1024 $spec --compare --torch-modes graph,compile-layers > /tmp/b.txt 2>&1
    grep -E "^\||torch|rror" /tmp/b.txt | grep -v "^|---" | cut -c1-220 | tail -8 >> "$S"
    cp /tmp/b.txt "$OUT/8b_${spec// /_}.txt"
  done
}

# ab VAR=VALUE "bench args": the 8B step at the default and with VAR=VALUE, alternating twice.
ab() {
  local x=$1 args=$2 v r
  for v in "SPECC_NONE=1" "$x" "SPECC_NONE=1" "$x"; do
    (( $(left) > 25 )) || return
    r=$(env "$v" timeout 40 .gpu2/specc bench $T8B --random-weights --iters 40 --context 1024 \
      $args 2>&1 | grep -E "^\| (decode|verify)|rror" | head -2 | cut -c1-110 | tr '\n' ' ')
    echo "$args $v: $r" >> "$S"
  done
}

# kimi LAYERS [--tokens N] [--per-kernel]: one Kimi-K2.5 int4 step at B = 1, ctx 1024.
kimi() {
  local layers=$1; shift
  (( $(left) > 60 )) || return
  local n="kimi_l${layers}${*// /_}"
  timeout $(( $(left) - 20 )) .gpu2/specc bench $KIMI --random-weights --layers "$layers" \
    --iters 30 --context 1024 "$@" > "$OUT/$n.txt" 2>&1
  echo "== $n rc=$? ($(left)s left)" >> "$S"
  grep -E "^\| (decode|verify)|experts|rror" "$OUT/$n.txt" | head -4 | cut -c1-200 >> "$S"
  sed -n '/^| family/,/^| group/p' "$OUT/$n.txt" >> "$S"
}

# kimi_layers: decode and a per-kernel verify(8) of Kimi-K2.5 int4 at 2 layers and at the most
# layers this card holds (12 on an H200, 6 on an H100).
kimi_layers() {
  local name many=6 layers
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
  [[ $name == *H200* ]] && many=12
  for layers in 2 $many; do
    kimi $layers
    kimi $layers --tokens 8 --per-kernel
  done
}

# per_kernel_8b SPEC...: the 8B step's per-kernel table for each spec, while 60 s are left.
per_kernel_8b() {
  local spec n
  for spec in "$@"; do
    (( $(left) > 60 )) || break
    n="8b${spec// /_}"
    timeout 90 .gpu2/specc bench $T8B --random-weights --iters 30 --context 1024 $spec \
      --per-kernel > "$OUT/$n.txt" 2>&1
    echo "== $n rc=$? ($(left)s left)" >> "$S"
    grep -E "^\| (decode|verify)" "$OUT/$n.txt" | head -1 >> "$S"
    sed -n '/^| family/,/^| group/p' "$OUT/$n.txt" >> "$S"
  done
}

# kimi_ab LAYERS SECS BIN...: the Kimi-K2.5 int4 decode and verify(8) at B = 1, ctx 1024 with
# each binary of .gpu2 in turn, two rounds, each run under SECS s and while more are left.
kimi_ab() {
  local layers=$1 secs=$2 round bin spec r; shift 2
  for round in 1 2; do
    for bin in "$@"; do
      (( $(left) > secs )) || return
      for spec in "" "--tokens 8"; do
        r=$(timeout "$secs" .gpu2/$bin bench $KIMI --random-weights --layers "$layers" --iters 30 \
          --context 1024 $spec 2>&1 | grep -E "^\| (decode|verify)|rror" | head -1 | cut -c1-110)
        echo "kimi l$layers $bin $spec: $r" >> "$S"
      done
    done
  done
}

# sweep_8b P CONC REQUESTS [NEED [MARGIN]]: issue 22's planted 8B serving sweep (16 lanes,
# 128-token requests, max context 2048) at acceptance P and concurrency CONC, plain against
# draft_model k = 7 adaptive, when more than NEED s (200) are left, stopping MARGIN s (40)
# before the budget; its table into the summary, its output into $OUT.
sweep_8b() {
  local p=$1 c=$2 n=$3 need=${4:-200} margin=${5:-40}
  (( $(left) > need )) || return
  CONC=$c REQUESTS=$n TOKENS=128 LANES=16 MAX_CONTEXT=2048 ACCEPT=$p \
    timeout $(( $(left) - margin )) bash scripts/device/serve_sweep_accept.sh 8b > /tmp/sweep.txt 2>&1
  echo "== sweep P=$p c=$c rc=$? ($(left)s left)" >> "$S"
  grep -vE "^\s*$" /tmp/sweep.txt | grep -E "sweep|tok/s|^ *$c |plain|$p|x\)" | head -16 >> "$S"
  cp /tmp/sweep.txt "$OUT/"
}
