#!/usr/bin/env bash
# A test server whose first port is taken starts on the next free one, says
# which, and writes it where the tests read it (scripts/test-ports.sh):
#   ports_test.sh redis|postgres|rabbitmq FIRST_PORT
# holds FIRST_PORT (and, for RabbitMQ, which takes three in a row, also the
# next three) with listeners of its own on 127.0.0.1, starts the server with
# scripts/test-<kind>.sh asked for FIRST_PORT, and checks that it listens on
# a later port, answers there, names that port in STATE/url and STATE/port
# and on its output, and that the held ports are still ours. Stops what it
# started, by PID.
set -euo pipefail
KIND=$1 FIRST=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SCRIPT=$ROOT/scripts/test-$KIND.sh
T=$(mktemp -d "${TMPDIR:-/tmp}/idem-ports-test.XXXXXX")
chmod 755 "$T"
holder=""
cleanup() {
  bash "$SCRIPT" stop "$T/state" >/dev/null 2>&1 || true
  [ -n "$holder" ] && kill "$holder" 2>/dev/null || true
  rm -rf "$T" "$T/state.lock"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The ports to hold: FIRST (RabbitMQ: FIRST..FIRST+3, so that neither FIRST
# nor FIRST+1 can begin its three).
held=1
[ "$KIND" = rabbitmq ] && held=4
python3 - "$FIRST" "$held" "$T/held" <<'PY' &
import socket, sys, time
first, n, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
socks = []
for p in range(first, first + n):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", p))
    s.listen()
    socks.append(s)
open(ready, "w").write("ok")
time.sleep(600)
PY
holder=$!
for _ in $(seq 100); do [ -s "$T/held" ] && break; kill -0 "$holder" 2>/dev/null || fail "could not hold port $FIRST (in use?)"; sleep 0.05; done
[ -s "$T/held" ] || fail "could not hold port $FIRST"

bash "$SCRIPT" start "$T/state" "$FIRST" >"$T/out" 2>"$T/err" || { cat "$T/err" >&2; fail "$KIND did not start with port $FIRST taken"; }
cat "$T/err"
url=$(cat "$T/out")
port=$(cat "$T/state/port")
[ "$port" -gt "$FIRST" ] || fail "$KIND took port $port, not one after $FIRST"
[ "$(cat "$T/state/url")" = "$url" ] || fail "STATE/url ($(cat "$T/state/url")) is not the URL printed ($url)"
[[ $url == *"127.0.0.1:$port"* ]] || fail "the URL $url does not name port $port"
grep -q "port $FIRST on 127.0.0.1 is in use: using $port" "$T/err" || fail "the start did not say which port it took"
case $KIND in
  redis)
    exec 3<>"/dev/tcp/127.0.0.1/$port"; printf 'PING\r\n' >&3; IFS= read -r -t 5 line <&3; exec 3>&-
    [[ $line == +PONG* ]] || fail "no PONG from 127.0.0.1:$port: $line" ;;
  postgres)
    PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
    [ "$("$PG_BIN/psql" "$url" -qAtc 'SELECT 1')" = 1 ] || fail "no answer from $url" ;;
  rabbitmq)
    exec 3<>"/dev/tcp/127.0.0.1/$port"; printf 'AMQP\x00\x00\x09\x01' >&3; IFS= read -r -N 1 -t 5 b <&3; exec 3>&-
    [[ $b == $'\x01' ]] || fail "no AMQP connection.start from 127.0.0.1:$port" ;;
  *) fail "unknown kind $KIND" ;;
esac
kill -0 "$holder" 2>/dev/null || fail "our listener on $FIRST is gone"
echo "ok: $KIND on 127.0.0.1:$port, $FIRST being taken"
