#!/usr/bin/env bash
# A throwaway DynamoDB Local for the tests (AWS's own jar, from the npm
# package amplify-dynamodb-simulator, run on Java 17): in memory, reachable
# only on 127.0.0.1, stopped by its PID.
#   test-dynamodb.sh start STATE_DIR PORT  -> prints the endpoint; writes STATE_DIR/url, STATE_DIR/pid
#     (PORT is the first port tried: the first free one from there on)
#   test-dynamodb.sh stop STATE_DIR
# DynamoDB Local has no listen-address option (it binds every interface):
# it runs with an LD_PRELOAD shim (scripts/loopback_bind.c, compiled into
# STATE_DIR) that turns its wildcard bind into 127.0.0.1.
# The npm package is installed when missing into
# ${IDEM_EMULATORS_DIR:-<repo>/.emulators} (under flock: several builds'
# fixtures may start at once).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/test-ports.sh"
PKG=amplify-dynamodb-simulator
VERSION=2.9.30
EMULATORS=${IDEM_EMULATORS_DIR:-$here/../.emulators}
JAVA=${JAVA:-$(command -v java || true)}

# The jar's folder, installing the package first when missing.
jar_dir() {
  mkdir -p "$EMULATORS"
  local dir="$EMULATORS/dynamodb-$VERSION" emu
  emu="$dir/node_modules/$PKG/emulator"
  (
    flock 9
    if [ ! -f "$emu/DynamoDBLocal.jar" ]; then
      command -v npm >/dev/null || { echo "test-dynamodb: npm not found (apt-get install npm)" >&2; exit 3; }
      echo "test-dynamodb: installing $PKG@$VERSION into $dir" >&2
      npm install --no-audit --no-fund --silent --prefix "$dir" "$PKG@$VERSION" >&2 \
        || { echo "test-dynamodb: npm install $PKG@$VERSION failed" >&2; exit 3; }
    fi
  ) 9>"$EMULATORS/.dynamodb.lock"
  echo "$emu"
}

# Whether something answers DynamoDB's ListTables on 127.0.0.1:$1.
answers() {
  curl -s -m 2 -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$1/" \
    -H 'Content-Type: application/x-amz-json-1.0' -H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
    -H 'Authorization: AWS4-HMAC-SHA256 Credential=idem/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=00' \
    -d '{}' 2>/dev/null | grep -q '^200$'
}

start() {
  local state=$1 port=$2
  [ -n "$JAVA" ] || { echo "test-dynamodb: java not found (apt-get install openjdk-17-jre-headless)" >&2; exit 3; }
  if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then
    echo "test-dynamodb: already running (pid $(cat "$state/pid"))" >&2
    cat "$state/url"; return 0
  fi
  rm -rf "$state"; mkdir -p "$state"
  local emu; emu=$(jar_dir)
  ${CC:-cc} -shared -fPIC -O2 -o "$state/loopback_bind.so" "$here/loopback_bind.c" -ldl \
    || { echo "test-dynamodb: could not build the loopback shim" >&2; exit 3; }
  local first=$port attempt pid
  for attempt in 1 2 3 4 5; do
    port=$(free_port "$port") || exit 3
    # In a session of its own, no inherited pipes; setsid execs in place, so
    # $! is java's PID.
    (cd "$emu" && LD_PRELOAD="$state/loopback_bind.so" exec setsid "$JAVA" -Xmx512m \
      -Djava.library.path=./DynamoDBLocal_lib -jar DynamoDBLocal.jar \
      -inMemory -port "$port" -disableTelemetry </dev/null >"$state/dynamodb.log" 2>&1) &
    pid=$!
    echo "$pid" >"$state/pid"
    for _ in $(seq 300); do
      answers "$port" && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    answers "$port" && break
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$state/pid"
    port_free "$port" && { echo "test-dynamodb: DynamoDB Local did not start:" >&2; tail -n 5 "$state/dynamodb.log" >&2; exit 3; }
    port=$((port + 1))
  done
  [ -f "$state/pid" ] || { echo "test-dynamodb: no port from $first on could be bound" >&2; exit 3; }
  say_port test-dynamodb "$first" "$port"
  echo "$port" >"$state/port"
  echo "http://127.0.0.1:$port" >"$state/url"
  echo "test-dynamodb: pid $pid on 127.0.0.1:$port" >&2
  cat "$state/url"
}

stop() {
  local state=$1
  [ -f "$state/pid" ] || { echo "test-dynamodb: not running" >&2; return 0; }
  local pid; pid=$(cat "$state/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"   # the server we started, by its PID only
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$state/pid"
  echo "test-dynamodb: stopped" >&2
}

case "${1:-}" in
  start) start "$2" "$3" ;;
  stop) stop "$2" ;;
  *) echo "usage: $0 start STATE_DIR PORT | stop STATE_DIR" >&2; exit 2 ;;
esac
