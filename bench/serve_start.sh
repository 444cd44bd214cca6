# Sourced by the CPU serving benches: `serve_start LOG FLAGS...` starts `$bin serve --port 0
# --lanes 16 FLAGS...` with its stderr in LOG, sets `server` (its pid) and `url` once it
# listens, and exits with the log when it never does; `rate URL` prints the output tok/s of
# one `specc bench-serve` sample against URL ($concurrency clients, $requests requests of 128
# tokens from $prompts; its JSON in $tmp).
serve_start() {
  local log=$1
  shift
  "$bin" serve --port 0 --lanes 16 "$@" 2>"$log" &
  server=$!
  url=""
  for _ in $(seq 600); do
    url=$(sed -n 's/.* on \(http:\/\/[0-9.:]*\).*/\1/p' "$log" | head -1)
    [[ -n $url ]] && return
    sleep 0.1
  done
  cat "$log" >&2
  exit 1
}

rate() {
  "$bin" bench-serve --url "$1" --concurrency "$concurrency" --requests "$requests" \
    --max-tokens 128 --prompts "$prompts" --ignore-eos --json "$tmp/out.json" >/dev/null
  python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))[0]["output_tok_s"])' "$tmp/out.json"
}
