# server_port LOG PID: the port a lesson10_serve started with `--port 0` (stdout to LOG) named on
# its first line, printed once its /health answers (60 s at most); nothing, and status 1, if the
# server dies first. (`--port 0`, not a port picked here and released: something else may take
# that one before the server binds it.) Sourced by ./course and tools/load_table.sh; needs $PY.
server_port() {
  local i port=""
  for i in $(seq 1 600); do
    kill -0 "$2" 2>/dev/null || return 1
    [ -z "$port" ] && port=$(sed -nE 's|^serving .* on http://127\.0\.0\.1:([0-9]+) .*|\1|p' "$1" | head -n 1)
    if [ -n "$port" ] && "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; then
      echo "$port"
      return 0
    fi
    sleep 0.1
  done
  return 1
}
