# Sourced by the CPU serving benches: `serve_start LOG FLAGS...` starts `$bin serve --port 0
# --lanes 16 FLAGS...` with its stderr in LOG, sets `server` (its pid) and `url` once it
# listens, and exits with the log when it never does.
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
