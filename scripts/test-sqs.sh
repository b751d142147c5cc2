#!/usr/bin/env bash
# A throwaway SQS emulator for the tests: fauxqs (npm, Node), in memory,
# listening only on 127.0.0.1 (scripts/fauxqs-preload.cjs: fauxqs itself
# binds 0.0.0.0), stopped by its PID.
#   test-sqs.sh start STATE_DIR PORT [manual-clock]   -> prints the endpoint URL;
#     writes STATE_DIR/url (http://127.0.0.1:PORT), STATE_DIR/pid
#     (PORT is the first port tried: the first free one from there on,
#     scripts/test-ports.sh). manual-clock: the emulator's clock stands
#     still and the tests set it (scripts/fauxqs-preload.cjs).
#   test-sqs.sh stop STATE_DIR
# fauxqs is installed when missing into ${IDEM_EMULATORS_DIR:-<repo>/.emulators}
# (npm, under flock: the fixtures of several builds may start at once).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/test-ports.sh"
FAUXQS_VERSION=2.4.1
emulators=${IDEM_EMULATORS_DIR:-$here/../.emulators}
prefix=$emulators/fauxqs-$FAUXQS_VERSION
cli=$prefix/node_modules/fauxqs/dist/cli.js

install_fauxqs() {
  [ -f "$cli" ] && return 0
  command -v node >/dev/null && command -v npm >/dev/null \
    || { echo "test-sqs: node and npm are needed (apt-get install nodejs npm)" >&2; exit 3; }
  mkdir -p "$emulators"
  (
    flock -w 600 9 || { echo "test-sqs: could not lock $emulators/.fauxqs.lock" >&2; exit 3; }
    if [ ! -f "$cli" ]; then
      echo "test-sqs: installing fauxqs@$FAUXQS_VERSION into $prefix" >&2
      npm install --no-audit --no-fund --prefix "$prefix" "fauxqs@$FAUXQS_VERSION" >&2 \
        || { echo "test-sqs: npm install fauxqs@$FAUXQS_VERSION failed" >&2; exit 3; }
    fi
  ) 9>"$emulators/.fauxqs.lock"
}

# Whether the emulator answers an SQS call on 127.0.0.1:$1.
answers() {
  curl -s -m 2 -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$1/" \
    -H 'Content-Type: application/x-amz-json-1.0' -H 'X-Amz-Target: AmazonSQS.ListQueues' \
    -H 'Authorization: AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=00' \
    -d '{}' 2>/dev/null | grep -q '^200$'
}

start() {
  local state=$1 port=$2 clock=${3:-}
  install_fauxqs
  if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then
    echo "test-sqs: already running (pid $(cat "$state/pid"))" >&2
    cat "$state/url"; return 0
  fi
  rm -rf "$state"; mkdir -p "$state"
  local first=$port attempt
  for attempt in 1 2 3 4 5; do
    port=$(free_port "$port") || exit 3
    launch "$state" "$port" "$clock" && break
    port=$((port + 1))
  done
  [ -f "$state/pid" ] || { echo "test-sqs: no port from $first on could be bound" >&2; exit 3; }
  say_port test-sqs "$first" "$port"
  echo "$port" >"$state/port"
  echo "http://127.0.0.1:$port" >"$state/url"
  echo "test-sqs: fauxqs pid $(cat "$state/pid") on 127.0.0.1:$port${clock:+ ($clock)}" >&2
  cat "$state/url"
}

launch() {
  local state=$1 port=$2 clock=$3 manual=0
  [ "$clock" = manual-clock ] && manual=1
  # In a session of its own, no inherited output pipes; setsid execs in
  # place, and so does env: $! is node's PID.
  setsid env FAUXQS_PORT="$port" FAUXQS_LOGGER=false FAUXQS_HOST=127.0.0.1 IDEM_FAUXQS_MANUAL_CLOCK=$manual \
    node --require "$here/fauxqs-preload.cjs" "$cli" </dev/null >"$state/fauxqs.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$state/pid"
  for _ in $(seq 300); do
    answers "$port" && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "test-sqs: fauxqs exited at start:" >&2; tail -n 5 "$state/fauxqs.log" >&2 || true
      rm -f "$state/pid"; return 3
    fi
    sleep 0.1
  done
  echo "test-sqs: fauxqs (pid $pid) does not answer on 127.0.0.1:$port" >&2
  kill -KILL "$pid" 2>/dev/null || true; rm -f "$state/pid"; return 3
}

stop() {
  local state=$1
  [ -f "$state/pid" ] || { echo "test-sqs: not running" >&2; return 0; }
  local pid; pid=$(cat "$state/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"   # the emulator we started, by its PID only
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$state/pid"
  echo "test-sqs: stopped" >&2
}

case "${1:-}" in
  start) start "$2" "$3" "${4:-}" ;;
  stop) stop "$2" ;;
  *) echo "usage: $0 start STATE_DIR PORT [manual-clock] | stop STATE_DIR" >&2; exit 2 ;;
esac
