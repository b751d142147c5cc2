#!/usr/bin/env bash
# Real HTTP clients through `idem gateway`: an express app (npm) as the
# upstream, Stripe's Node client and got as the clients, the first answer of
# every key lost between client and gateway (clients.mjs says what it
# checks), then the gateway's counters. The npm packages are installed
# pinned by npm-packages.sh (never a skip: the test fails without them).
#   gateway_clients_test.sh IDEM_BINARY
set -u
IDEM=$1
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL $*"; exit 1; }

command -v node >/dev/null || fail "node is not installed (the test command installs nodejs)"
NPM_DIR=$("$HERE/npm-packages.sh") || fail "cannot install the npm packages"
# shellcheck source=../../cli/checks.sh
source "$HERE/../../cli/checks.sh"
wait_up() {  # wait_up URL PID LOG
  for _ in $(seq 300); do
    curl -sf -o /dev/null "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || fail "exited at start: $(tail -5 "$3")"
    sleep 0.1
  done
  fail "$1 did not answer"
}

UPORT=$(free_port 28600 100)
NODE_PATH="$NPM_DIR/node_modules" node "$HERE/upstream.js" "$UPORT" >"$T/upstream.log" 2>&1 &
PIDS+=($!)
wait_up "http://127.0.0.1:$UPORT/health" "$!" "$T/upstream.log"
GPORT=$(free_port 28700 100)
"$IDEM" gateway --upstream "http://127.0.0.1:$UPORT" --listen "127.0.0.1:$GPORT" --store "sqlite:$T/g.db" \
  --quiet 2>"$T/gateway.log" &
GPID=$!
PIDS+=("$GPID")
wait_up "http://127.0.0.1:$GPORT/metrics" "$GPID" "$T/gateway.log"

node "$HERE/clients.mjs" "$NPM_DIR" "$GPORT" "$UPORT" | tee "$T/out"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { tail -20 "$T/gateway.log"; fail "clients.mjs exit $rc"; }
curl -sf "http://127.0.0.1:$GPORT/metrics" >"$T/metrics" || fail "no /metrics"
# 60 keys forwarded once each; the lost answers' retries and the repeats replayed.
grep -q '^idem_gateway_forwarded_total 60$' "$T/metrics" || fail "forwarded: $(grep '^idem_gateway_forwarded' "$T/metrics")"
replayed=$(sed -n 's/^idem_gateway_replayed_total //p' "$T/metrics")
[ "${replayed:-0}" -ge 105 ] || fail "replayed: $replayed (60 retries after lost answers + 45 repeats expected)"
echo "ok: 60 keys through idem gateway, each run once upstream; $replayed replays"
