#!/usr/bin/env bash
# A throwaway redis-server for the tests: data in a temporary directory,
# listening only on 127.0.0.1 at an unusual port, AOF on (fsync every second),
# no RDB snapshots; stopped by its PID.
#   test-redis.sh start STATE_DIR PORT   -> prints the URL; writes STATE_DIR/url, STATE_DIR/pid
#     (PORT is the first port tried: the server takes the first free one from
#     there on, scripts/test-ports.sh, and says so when it is not PORT)
#   test-redis.sh stop STATE_DIR
#   test-redis.sh pause|resume STATE_DIR   (stop and start again, data kept: a restart)
# Users: "default" (no password) and "idem_pw" (password "secret"), for the
# wrong-password tests.
set -euo pipefail
REDIS_SERVER=${REDIS_SERVER:-$(command -v redis-server || true)}
source "$(dirname "$0")/test-ports.sh"

# Whether something answers PING with PONG on 127.0.0.1:$1.
answers_ping() {
  (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'PING\r\n' >&3
    IFS= read -r -t 2 line <&3 || exit 1
    [[ $line == +PONG* ]]
  ) 2>/dev/null
}

start() {
  local state=$1 port=$2
  [ -n "$REDIS_SERVER" ] && [ -x "$REDIS_SERVER" ] \
    || { echo "test-redis: redis-server not found (apt-get install redis-server)" >&2; exit 3; }
  if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then
    echo "test-redis: already running (pid $(cat "$state/pid"))" >&2
    cat "$state/url"; return 0
  fi
  rm -rf "$state"; mkdir -p "$state"
  local base; base=$(mktemp -d "${TMPDIR:-/tmp}/idem-redis.XXXXXX")
  echo "$base" >"$state/base"
  # The first free port from $2 on; if another start took it meanwhile (the
  # server cannot bind it), the next free one.
  local first=$port attempt
  for attempt in 1 2 3 4 5; do
    port=$(free_port "$port") || exit 3
    echo "$port" >"$state/port"
    launch "$state" "$port" "$base" && break
    port_free "$port" && { echo "test-redis: redis-server did not start on 127.0.0.1:$port" >&2; exit 3; }
    port=$((port + 1))
  done
  [ -f "$state/pid" ] || { echo "test-redis: no port from $first on could be bound" >&2; exit 3; }
  say_port test-redis "$first" "$port"
  echo "redis://127.0.0.1:$port" >"$state/url"
  echo "test-redis: pid $(cat "$state/pid") on 127.0.0.1:$port, data in $base" >&2
  cat "$state/url"
}

# Starts redis-server on $2 with its data in $3; returns 3 if it does not answer.
launch() {
  local state=$1 port=$2 base=$3
  # In the background, in a session of its own (so a test runner's signals to
  # its process group do not reach it), with no inherited output pipes (so
  # the runner does not wait for them). setsid execs in place: $! is the
  # server's PID.
  setsid "$REDIS_SERVER" --bind 127.0.0.1 --port "$port" --save '' --appendonly yes --appendfsync everysec \
    --daemonize no --dir "$base" --logfile "$base/redis.log" \
    --user idem_pw on '>secret' '~*' '&*' '+@all' </dev/null >/dev/null 2>&1 &
  local pid=$!
  echo "$pid" >"$state/pid"
  for _ in $(seq 300); do
    answers_ping "$port" && break
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "test-redis: redis-server exited at start:" >&2; tail -n 5 "$base/redis.log" >&2 2>/dev/null || true
      rm -f "$state/pid"; return 3
    fi
    sleep 0.1
  done
  if ! answers_ping "$port"; then
    echo "test-redis: redis-server (pid $pid) does not answer PING on 127.0.0.1:$port" >&2
    kill -KILL "$pid" 2>/dev/null || true; rm -f "$state/pid"; return 3
  fi
}

# Stops the server (SIGTERM: it writes its AOF) but keeps its data.
pause() {
  local state=$1
  local pid; pid=$(cat "$state/pid")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$state/pid"
}
resume() {
  local state=$1
  launch "$state" "$(cat "$state/port")" "$(cat "$state/base")" || exit 3
}

stop() {
  local state=$1
  [ -f "$state/pid" ] || { echo "test-redis: not running" >&2; return 0; }
  local pid; pid=$(cat "$state/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"   # the server we started, by its PID only
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  local base; base=$(cat "$state/base" 2>/dev/null || true)
  case "$base" in */idem-redis.*) rm -rf "$base" ;; esac
  rm -f "$state/pid"
  echo "test-redis: stopped" >&2
}

case "${1:-}" in
  start) start "$2" "$3" ;;
  stop) stop "$2" ;;
  pause) pause "$2" ;;
  resume) resume "$2" ;;
  *) echo "usage: $0 start STATE_DIR PORT | stop STATE_DIR | pause STATE_DIR | resume STATE_DIR" >&2; exit 2 ;;
esac
