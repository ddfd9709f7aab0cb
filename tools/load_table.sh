#!/usr/bin/env bash
# Lesson 10's table: naive serving against the engine, each at several numbers of users, into
# OUT/load.csv (one row per run, lesson10_load's columns). `./course load --table` runs it on the
# CPU (then plots it); `./course gpu-check` with --device cuda.
#
#   tools/load_table.sh BIN OUT DURATION "USERS" [SERVER OPTION ...] [-- LOAD OPTION ...]
#
# BIN holds lesson10_serve and lesson10_load; each server's log goes to OUT/serve-MODE.log.
set -uo pipefail
bin=${1:?BIN}; out=${2:?OUT}; duration=${3:?DURATION}; users=${4:?USERS}; shift 4
serve_args=() load_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do serve_args+=("$1"); shift; done
[ $# -gt 0 ] && shift
load_args=("$@")
PY=$(command -v python3 || echo /usr/bin/python3)
mkdir -p "$out"
rm -f "$out/load.csv"

. "$(dirname "$0")/server_port.sh"

# Ctrl-C or a TERM stops the server and the load client running now (a background server would
# otherwise outlive this script, its port still bound). The client runs in the background too, so
# that the trap runs at once: bash runs a trap only between commands.
pid="" client=""
stop() {
  trap - INT TERM HUP
  [ -n "$client" ] && kill -TERM "$client" 2>/dev/null
  [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null
  wait 2>/dev/null
  echo "load_table: stopped" >&2
  exit 130
}
trap stop INT TERM HUP

for mode in naive engine; do
  extra=()
  [ "$mode" = naive ] && extra=(--naive)
  "$bin/lesson10_serve" --port 0 "${extra[@]}" "${serve_args[@]}" >"$out/serve-$mode.log" 2>&1 &
  pid=$!
  if ! port=$(server_port "$out/serve-$mode.log" "$pid"); then
    cat "$out/serve-$mode.log" >&2
    echo "load_table: the $mode server did not start" >&2
    kill "$pid" 2>/dev/null
    exit 1
  fi
  for u in $users; do
    "$bin/lesson10_load" --port "$port" --users "$u" --duration "$duration" --label "$mode" --csv "$out/load.csv" \
      "${load_args[@]}" &
    client=$!
    wait "$client"
    status=$?
    client=""
    if [ $status -ne 0 ]; then
      echo "load_table: the load run failed ($mode, $u users)" >&2
      kill "$pid" 2>/dev/null
      exit 1
    fi
  done
  kill -INT "$pid"
  wait "$pid" || true
  pid=""
done
