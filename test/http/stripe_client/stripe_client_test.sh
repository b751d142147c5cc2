#!/usr/bin/env bash
# Stripe's own Node.js client against `idem provider` losing responses
# (charges.js says what it checks), then the provider's counters: every
# charge executed once, the client's retries replayed.
#   stripe_client_test.sh IDEM_BINARY
set -u
IDEM=$1
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
PPID_=""
cleanup() {
  [ -n "$PPID_" ] && kill "$PPID_" 2>/dev/null && wait "$PPID_" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL $*"; exit 1; }

command -v node >/dev/null || fail "node is not installed (the test command installs nodejs)"
tar -xzf "$HERE/stripe-23.2.0.tgz" -C "$T" || fail "cannot unpack stripe-23.2.0.tgz"

# A port in [23500, 24500) that nothing listens on now.
for _ in $(seq 50); do
  PORT=$((23500 + RANDOM % 1000))
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null || break
done
"$IDEM" provider --api-key sk_test_idem:acct_1 --listen "127.0.0.1:$PORT" --store "sqlite:$T/provider.db" \
  --lose-responses 0.5 --seed 7 2>"$T/provider.log" &
PPID_=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 "$PPID_" 2>/dev/null || fail "the provider exited: $(cat "$T/provider.log")"
  sleep 0.1
done

node "$HERE/charges.js" "$T/package" "http://127.0.0.1:$PORT" sk_test_idem | tee "$T/out"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { tail -20 "$T/provider.log"; fail "charges.js exit $rc"; }

curl -sf "http://127.0.0.1:$PORT/metrics" >"$T/metrics" || fail "no /metrics"
dropped=$(grep -c "outcome=response-dropped" "$T/provider.log")
# 40 charges and nothing else executed (the refused requests never ran).
grep -q '^idem_http_executed_total 40$' "$T/metrics" || fail "executed: $(grep '^idem_http_executed' "$T/metrics")"
grep -q '^idem_http_conflicts_total 1$' "$T/metrics" || fail "conflicts: $(grep '^idem_http_conflicts' "$T/metrics")"
[ "$dropped" -gt 0 ] || fail "the provider dropped no response"
kill "$PPID_"; wait "$PPID_"; rc=$?
PPID_=""
[ "$rc" -eq 0 ] || fail "the provider exit $rc after SIGTERM"
echo "ok: 40 charges, $dropped responses dropped and retried by stripe-node"
