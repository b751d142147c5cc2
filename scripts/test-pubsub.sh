#!/usr/bin/env bash
# A throwaway Google Cloud Pub/Sub emulator for the tests (idem::pubsub),
# listening only on 127.0.0.1 at an unusual port, in memory; stopped by its
# PID.
#   test-pubsub.sh start STATE_DIR PORT   -> prints the endpoint; writes STATE_DIR/url, STATE_DIR/pid
#     (PORT is the first port tried: the emulator takes the first free one
#     from there on, scripts/test-ports.sh, and says so when it is not PORT)
#   test-pubsub.sh stop STATE_DIR
# The emulator is Google's (the Debian package google-cloud-cli-pubsub-emulator,
# from Google's apt repository, doc/install.md) and needs Java
# (openjdk-17-jre-headless). It cannot be installed from Debian's own
# repositories: when it is absent this fails, naming the package.
# PUBSUB_EMULATOR_BIN overrides where it is looked for.
set -euo pipefail
EMULATOR=${PUBSUB_EMULATOR_BIN:-/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator}
source "$(dirname "$0")/test-ports.sh"

# Whether the emulator answers HTTP on 127.0.0.1:$1 (GET / says "Ok").
answers_http() {
  (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
    IFS= read -r -t 2 line <&3 || exit 1
    [[ $line == HTTP/1.1\ 200* ]]
  ) 2>/dev/null
}

start() {
  local state=$1 port=$2
  if [ ! -x "$EMULATOR" ]; then
    echo "test-pubsub: Google's Pub/Sub emulator is not installed ($EMULATOR): install the package" \
      "google-cloud-cli-pubsub-emulator from Google's apt repository (packages.cloud.google.com/apt," \
      "see doc/install.md), or set PUBSUB_EMULATOR_BIN" >&2
    exit 3
  fi
  command -v java >/dev/null \
    || { echo "test-pubsub: the Pub/Sub emulator needs Java (apt-get install openjdk-17-jre-headless)" >&2; exit 3; }
  if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then
    echo "test-pubsub: already running (pid $(cat "$state/pid"))" >&2
    cat "$state/url"; return 0
  fi
  rm -rf "$state"; mkdir -p "$state"
  local first=$port attempt
  for attempt in 1 2 3 4 5; do
    port=$(free_port "$port") || exit 3
    echo "$port" >"$state/port"
    launch "$state" "$port" && break
    port_free "$port" && { echo "test-pubsub: the emulator did not start on 127.0.0.1:$port" >&2; exit 3; }
    port=$((port + 1))
  done
  [ -f "$state/pid" ] || { echo "test-pubsub: no port from $first on could be bound" >&2; exit 3; }
  say_port test-pubsub "$first" "$port"
  echo "http://127.0.0.1:$port" >"$state/url"
  echo "test-pubsub: pid $(cat "$state/pid") on 127.0.0.1:$port, log in $state/emulator.log" >&2
  cat "$state/url"
}

# Starts the emulator on $2; returns 3 if it does not answer.
launch() {
  local state=$1 port=$2
  # In a session of its own, no inherited output pipes; the launcher script
  # execs java, so $! is the server's PID.
  setsid "$EMULATOR" --host=127.0.0.1 --port="$port" </dev/null >"$state/emulator.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$state/pid"
  for _ in $(seq 600); do
    answers_http "$port" && break
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "test-pubsub: the emulator exited at start:" >&2; tail -n 5 "$state/emulator.log" >&2 || true
      rm -f "$state/pid"; return 3
    fi
    sleep 0.1
  done
  if ! answers_http "$port"; then
    echo "test-pubsub: the emulator (pid $pid) does not answer on 127.0.0.1:$port" >&2
    kill -KILL "$pid" 2>/dev/null || true; rm -f "$state/pid"; return 3
  fi
}

stop() {
  local state=$1
  [ -f "$state/pid" ] || { echo "test-pubsub: not running" >&2; return 0; }
  local pid; pid=$(cat "$state/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"   # the emulator we started, by its PID only
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$state/pid"
  echo "test-pubsub: stopped" >&2
}

case "${1:-}" in
  start) start "$2" "$3" ;;
  stop) stop "$2" ;;
  *) echo "usage: $0 start STATE_DIR PORT | stop STATE_DIR" >&2; exit 2 ;;
esac
