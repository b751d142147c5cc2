#!/usr/bin/env bash
# idem provider side by side with express + express-idempotency (the peer in
# ../shared/peers/http-idempotency-key) in one round, driven by wrk the same
# way (one wrk thread, CONCURRENCY keep-alive connections, N distinct keys):
#   phase "first":  N POST /charges with N new keys   (every request executes)
#   phase "replay": the same N requests again          (every request is a replay)
# express-idempotency keeps its records in Redis (no persistence, as the peers
# run it) and inserts the charge row in PostgreSQL (autocommit, fsync on).
# idem provider keeps claims, stored responses and charges in PostgreSQL
# (fsync on, synchronous_commit on), or in SQLite (WAL, synchronous=FULL):
# every commit is on disk before it answers.
#   bench/peers/http-vs-express.sh                 # RUNS=3, N=20000
#   RUNS=1 N=2000 bench/peers/http-vs-express.sh   # smoke
#   MODES="group-commit group-commit-fibers" bench/peers/http-vs-express.sh   # some of idem's modes
# Needs node/npm, redis-server and wrk (the peers' README).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
PEERS=${PEERS:-$ROOT/../shared/peers}
[ -x "$IDEM" ] || { echo "build idem first (./run build): $IDEM" >&2; exit 2; }
command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk" >&2; exit 2; }
N=${N:-20000}
CONCURRENCY=${CONCURRENCY:-16}
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-http.XXXXXX")
cp -r "$PEERS" "$work/"
P=$work/peers
chmod -R u+w "$P"
started=0
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  [ $started = 1 ] && "$P/services.sh" stop
}
trap cleanup EXIT
if ! "$P/services.sh" status | grep -q '^postgres: running'; then "$P/services.sh" start; started=1; fi
eval "$("$P/services.sh" env)"
(cd "$P/http-idempotency-key" && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; })
PSQL=(/usr/lib/postgresql/15/bin/psql -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -qAt)

wait_up() {  # wait_up URL
  for _ in $(seq 100); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "server at $1 did not start" >&2; exit 3
}
# phase NAME PHASE URL LUA: one wrk pass of N requests; prints one result line.
phase() {
  local name=$1 ph=$2 url=$3 lua=$4 out
  # Every pass starts with nothing left to write back from the one before
  # (or from the setup: npm ci, initdb), so no pass pays for another's dirty
  # pages with slower syncs.
  sync
  out=$(K=$N TOTAL=$N API_KEY=sk_bench wrk -t1 -c"$CONCURRENCY" -d600s --timeout 30s -s "$lua" "$url" 2>&1)
  local line; line=$(grep -o 'lua: .*' <<<"$out") || { echo "$out" >&2; exit 3; }
  local s p50 p99 bad
  s=$(sed -n 's/.*elapsed_s=\([0-9.]*\).*/\1/p' <<<"$line")
  p50=$(sed -n 's/.*p50_ms=\([0-9.]*\).*/\1/p' <<<"$line")
  p99=$(sed -n 's/.*p99_ms=\([0-9.]*\).*/\1/p' <<<"$line")
  bad=$(sed -n 's/.* bad=\([0-9]*\).*socket_errors=\([0-9]*\).*/\1+\2/p' <<<"$line")
  awk -v n="$N" -v s="$s" -v name="$name" -v ph="$ph" -v p50="$p50" -v p99="$p99" -v bad="$bad" \
    'BEGIN { printf "peer=%s phase=%s requests=%d seconds=%.3f requests_per_s=%.1f p50_ms=%s p99_ms=%s bad=%s\n", name, ph, n, s, n / s, p50, p99, bad }'
}

for i in $(seq "${RUNS:-3}"); do
  echo "== round $i" | tee -a "$work/lines"
  # express + express-idempotency (Redis records, PostgreSQL charge row)
  (cd "$P/http-idempotency-key" && HTTP_PORT=58080 EFFECT=pg exec node server.js >/dev/null) &
  server_pid=$!
  wait_up http://127.0.0.1:58080
  curl -sf -X POST http://127.0.0.1:58080/reset >/dev/null
  phase express-idempotency first http://127.0.0.1:58080 "$P/http-idempotency-key/charges.lua" | tee -a "$work/lines"
  phase express-idempotency replay http://127.0.0.1:58080 "$P/http-idempotency-key/charges.lua" | tee -a "$work/lines"
  echo "info: express stats $(curl -sf http://127.0.0.1:58080/stats)"
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=

  # idem provider (claims, responses and charges in PostgreSQL), a fresh
  # database each: two-phase (the default: claim committed, charge, response
  # committed), --one-transaction (claim, charge and response in one commit),
  # and --group-commit (requests arriving during a commit share the next
  # one), with a thread per connection and with the connections as fibers on
  # one thread (--fibers 1); then the same group commit on SQLite (WAL,
  # synchronous=FULL), both ways.
  for mode in ${MODES:-two-phase one-transaction group-commit group-commit-fibers sqlite-group-commit sqlite-group-commit-fibers}; do
    db=idem_http_${i}_${mode//-/_}
    flags=(--quiet)
    case $mode in
      one-transaction) flags+=(--one-transaction) ;;
      group-commit) flags+=(--one-transaction --group-commit 64) ;;
      group-commit-fibers) flags+=(--one-transaction --group-commit 64 --fibers 1) ;;
      sqlite-group-commit) flags+=(--one-transaction --group-commit 64) ;;
      sqlite-group-commit-fibers) flags+=(--one-transaction --group-commit 64 --fibers 1) ;;
    esac
    if [[ $mode == sqlite-* ]]; then
      store="sqlite:$work/$db.db"
      count() { sqlite3 "$work/$db.db" "$1"; }
    else
      "${PSQL[@]}" -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
      store="postgres://$PGUSER@$PGHOST:$PGPORT/$db"
      count() { "${PSQL[@]}" -d "$db" -c "$1"; }
    fi
    "$IDEM" provider --listen 127.0.0.1:58081 --store "$store" --api-key sk_bench:acct_bench "${flags[@]}" &
    server_pid=$!
    wait_up http://127.0.0.1:58081
    phase "idem-provider-$mode" first http://127.0.0.1:58081 "$ROOT/bench/http/charges.lua" | tee -a "$work/lines"
    phase "idem-provider-$mode" replay http://127.0.0.1:58081 "$ROOT/bench/http/charges.lua" | tee -a "$work/lines"
    echo "info: idem $mode charges=$(count 'SELECT count(*) FROM provider_charges') distinct_keys=$(count 'SELECT count(DISTINCT idem_key) FROM provider_charges')"
    kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=
done
done
echo "== summary: requests/s against express's in the same round (bench/peers/http-summary.sh)"
"$ROOT/bench/peers/http-summary.sh" "$work/lines"
