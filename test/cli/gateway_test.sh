#!/usr/bin/env bash
# idem gateway end to end: its help, bad flags (exit 2), an unreachable store
# (exit 3), then in front of `idem provider` (the upstream, which logs one
# line per request it receives): a key forwarded once and replayed, 422, the
# metrics, JSON logs, and SIGTERM (exit 0).
# usage: gateway_test.sh IDEM_BINARY
set -uo pipefail
IDEM=$1
T=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$T"' EXIT
fails=0
pass=0
# shellcheck source=checks.sh
source "$(dirname "$0")/checks.sh"

check help 0 "$IDEM" gateway --help
has help-usage "$T/out" "usage: idem gateway --upstream URL"
has help-unknown-rule "$T/out" "outcome-unknown"
check no-upstream 2 "$IDEM" gateway --store "sqlite:$T/g.db"
has no-upstream-named "$T/err" "--upstream URL is required"
check bad-listen 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --listen nowhere --store "sqlite:$T/g.db"
has bad-listen-named "$T/err" "--listen must be HOST:PORT"
check bad-url 2 "$IDEM" gateway --upstream ftp://example.com --store "sqlite:$T/g.db"
has bad-url-named "$T/err" "must start with http:// or https://"
check both-key-modes 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --require-key --pass-keyless
has both-key-modes-named "$T/err" "exclude each other"
check bad-stored-body 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --max-stored-body 0 --store "sqlite:$T/g.db"
check short-lease 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --lease 1s --store "sqlite:$T/g.db"
has short-lease-named "$T/err" "lease_ms must be more than"
check unknown-flag 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --frobnicate
check bad-trusted-proxy 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --trusted-proxy 10.0.0.0/8,lb.internal
has bad-trusted-proxy-named "$T/err" "--trusted-proxy: 'lb.internal' is not an IP address or CIDR block"
check bad-spooled-body 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --max-spooled-body -1
has bad-spooled-body-named "$T/err" "max-spooled-body"
check proxy-protocol-alone 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --proxy-protocol
has proxy-protocol-alone-named "$T/err" "--proxy-protocol needs --trusted-proxy"
check store-unreachable 3 "$IDEM" gateway --upstream http://127.0.0.1:9 --store "postgres://nobody@127.0.0.1:1/none"
has store-unreachable-named "$T/err" "cannot connect to PostgreSQL"

wait_up() {  # wait_up PORT PID
  for _ in $(seq 600); do
    curl -s -o /dev/null "http://127.0.0.1:$1/metrics" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# Ports from 28400 on (this build's range for its own servers).
UPORT=$(free_port 28400 100)
"$IDEM" provider --api-key sk_g:acct_g --listen "127.0.0.1:$UPORT" --store "sqlite:$T/prov.db" 2>"$T/prov.log" &
UPID=$!
PIDS+=("$UPID")
ok upstream-up wait_up "$UPORT" "$UPID"
GPORT=$(free_port 28500 100)
"$IDEM" gateway --upstream "http://127.0.0.1:$UPORT" --listen "127.0.0.1:$GPORT" --store "sqlite:$T/g.db" \
  --paths /charges --json 2>"$T/gw.log" &
GPID=$!
PIDS+=("$GPID")
ok gateway-up wait_up "$GPORT" "$GPID"
for n in 1 2; do
  curl -s -o "$T/charge$n" -D "$T/headers$n" -X POST "http://127.0.0.1:$GPORT/charges" \
    -H 'Authorization: Bearer sk_g' -H 'Idempotency-Key: "gw-1"' -H 'Content-Type: application/json' \
    -d '{"amount": 4000, "currency": "usd", "customer": "cus_g"}'
done
has first-201 "$T/headers1" "^HTTP/1.1 201"
has repeat-201 "$T/headers2" "^HTTP/1.1 201"
has repeat-replayed "$T/headers2" "Idempotent-Replayed: true"
ok same-body cmp -s "$T/charge1" "$T/charge2"
# The provider saw the key once: the repeat never left the gateway.
ok upstream-once test "$(grep -c 'key=gw-1' "$T/prov.log")" = 1
curl -s -o "$T/other" -D "$T/headers3" -X POST "http://127.0.0.1:$GPORT/charges" \
  -H 'Authorization: Bearer sk_g' -H 'Idempotency-Key: "gw-1"' -H 'Content-Type: application/json' \
  -d '{"amount": 9000, "currency": "usd", "customer": "cus_g"}'
has reused-422 "$T/headers3" "^HTTP/1.1 422"
has reused-problem "$T/headers3" "application/problem\+json"
curl -s -o /dev/null -D "$T/headers4" -X POST "http://127.0.0.1:$GPORT/charges" -H 'Authorization: Bearer sk_g' \
  -d '{}'
has keyless-400 "$T/headers4" "^HTTP/1.1 400"
curl -s "http://127.0.0.1:$GPORT/metrics" >"$T/metrics"
has metrics-forwarded "$T/metrics" "^idem_gateway_forwarded_total 1$"
has metrics-replayed "$T/metrics" "^idem_gateway_replayed_total 1$"
has metrics-conflicts "$T/metrics" "^idem_gateway_conflicts_total 1$"
has metrics-histogram "$T/metrics" 'idem_gateway_request_seconds_count\{outcome="forwarded"\} 1'
has json-log "$T/gw.log" \
  '^\{"ts_ms":[0-9]+,"method":"POST","path":"/charges","key":"gw-1","outcome":"forwarded","status":201,"latency_ms":[0-9.e+-]+\}$'
has json-log-replayed "$T/gw.log" '"key":"gw-1","outcome":"replayed","status":201,'
has json-log-conflict "$T/gw.log" '"key":"gw-1","outcome":"conflict","status":422,'
# A client's text is escaped: a malformed key with a quote, a backslash and a tab.
curl -s -o /dev/null -X POST "http://127.0.0.1:$GPORT/charges" -H 'Authorization: Bearer sk_g' \
  -H "$(printf 'Idempotency-Key: x"y\\z\tw')" -d '{}'
has json-log-escaped "$T/gw.log" '"key":"x\\"y\\\\z\\tw","outcome":"refused","status":400,'
# (AddressSanitizer's one warning about fibers' swapcontext aside)
ok json-log-one-object-a-line test "$(grep -v "^==[0-9]*==WARNING: ASan doesn't fully support makecontext" "$T/gw.log" |
  grep -cv '^{.*}$')" = 0
kill -TERM "$GPID"
wait "$GPID"
ok sigterm-exit-0 test "$?" = 0

# Waiting, retention and purge, and the live view: a key purged once its
# retention ended is forwarded again; the view's /state and /metrics.
check bad-wait 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --wait-ms -1 --store "sqlite:$T/g.db"
has bad-wait-named "$T/err" "wait-ms"
check bad-keep-alive 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --keep-alive-requests 0 --store "sqlite:$T/g.db"
has bad-keep-alive-named "$T/err" "keep-alive-requests"
check bad-max-keys 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --max-keys-per-principal -1 --store "sqlite:$T/g.db"
has bad-max-keys-named "$T/err" "max-keys-per-principal"
check bad-purge-every 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --purge-every soon --store "sqlite:$T/g.db"
check bad-web 2 "$IDEM" gateway --upstream http://127.0.0.1:9 --web nowhere --store "sqlite:$T/g.db"
GPORT=$(free_port 28500 100)
WPORT=$(free_port 28600 100)
"$IDEM" gateway --upstream "http://127.0.0.1:$UPORT" --listen "127.0.0.1:$GPORT" --store "sqlite:$T/g2.db" \
  --retention 1s --purge-every 100ms --wait-ms 5000 --web "127.0.0.1:$WPORT" --quiet 2>"$T/gw2.log" &
GPID=$!
PIDS+=("$GPID")
ok gateway2-up wait_up "$GPORT" "$GPID"
charge() {  # charge KEY OUT
  curl -s -o /dev/null -D "$2" -X POST "http://127.0.0.1:$GPORT/charges" -H 'Authorization: Bearer sk_g' \
    -H "Idempotency-Key: \"$1\"" -H 'Content-Type: application/json' \
    -d '{"amount": 100, "currency": "usd", "customer": "cus_p"}'
}
charge purge-1 "$T/p1"
has purge-first-201 "$T/p1" "^HTTP/1.1 201"
purged() {
  for _ in $(seq 300); do
    curl -s "http://127.0.0.1:$GPORT/metrics" | grep -q '^idem_gateway_purged_total 1$' && return 0
    sleep 0.1
  done
  return 1
}
ok purged-after-retention purged
charge purge-1 "$T/p2"
curl -s "http://127.0.0.1:$GPORT/metrics" >"$T/metrics2"
has purged-key-forwarded-again "$T/metrics2" "^idem_gateway_forwarded_total 2$"
has purged-waiting-gauge "$T/metrics2" "^idem_gateway_waiting 0$"
curl -s "http://127.0.0.1:$WPORT/state" >"$T/state"
has live-state-process "$T/state" '"process":"idem gateway"'
has live-state-claims "$T/state" '"claim_started":2'
curl -s "http://127.0.0.1:$WPORT/metrics" >"$T/web-metrics"
has live-metrics "$T/web-metrics" "^idem_gateway_forwarded_total 2$"
kill -TERM "$GPID"
wait "$GPID"
ok sigterm2-exit-0 test "$?" = 0

echo "gateway_test: $pass passed, $fails failed"
[ "$fails" -eq 0 ]
