#!/usr/bin/env bash
# idem's outbox relay side by side with pg-transactional-outbox's outbox in one
# round, on one PostgreSQL server (the peers' services.sh: fsync on,
# synchronous_commit on, wal_level=logical for the peer's replication listener)
# and one RabbitMQ broker (scripts/test-rabbitmq.sh). RUNS times in turn:
#   pg-transactional-outbox, polling listener (BATCH, POLL_MS: the best setting found)
#   pg-transactional-outbox, logical-replication listener (per-segment mutex)
#   idem bench relay --store postgres://.../idem_relay --to amqp://...
# Same workload: N messages (20000) over K keys (1000), ~100-byte payloads,
# preloaded, then relayed; the clock stops when a separate consumer holds all N.
# Then the medians, the ratio idem / best peer mode, and one latency run of
# each side at half its median rate (LAT_SECONDS of messages, 10).
# Databases: pto_relay for the peer, idem_relay for idem.
#   bench/peers/outbox-vs-pg-transactional-outbox.sh              # RUNS=3
#   RUNS=1 N=2000 bench/peers/outbox-vs-pg-transactional-outbox.sh
# Needs node/npm (the peer's npm ci) and rabbitmq-server.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
PEERS=${PEERS:-$ROOT/../shared/peers}
PEER=$ROOT/bench/peers/pg-transactional-outbox-relay
[ -d "$PEERS" ] || { echo "no peers at $PEERS" >&2; exit 2; }
export N=${N:-20000} K=${K:-1000} PAYLOAD_BYTES=${PAYLOAD_BYTES:-100}
RUNS=${RUNS:-3}
BATCH=${BATCH:-16} POLL_MS=${POLL_MS:-10} POOL=${POOL:-16}
LAT_SECONDS=${LAT_SECONDS:-10}
AMQP_PORT=${AMQP_PORT:-56741}

have_idem=0
if [ -x "$IDEM" ] && "$IDEM" bench relay --help >/dev/null 2>&1; then
  have_idem=1
else
  echo "note: $IDEM has no 'bench relay' (build it first): the idem rows are skipped" >&2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-outbox-peer.XXXXXX")
started_pg=0
cleanup() {
  "$ROOT/scripts/test-rabbitmq.sh" stop "$work/rabbitmq" || true
  if [ "$started_pg" = 1 ]; then "$PEERS/services.sh" stop || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
status=$("$PEERS/services.sh" status)
if ! grep -q '^postgres: running' <<<"$status"; then
  PG_WAL_LEVEL=logical "$PEERS/services.sh" start
  started_pg=1
fi
eval "$("$PEERS/services.sh" env)"
[ "$(psql -d postgres -qAt -c 'show wal_level')" = logical ] \
  || { echo "PostgreSQL runs with wal_level != logical: $PEERS/services.sh stop, then rerun" >&2; exit 2; }
psql -d postgres -qAt -c "DROP DATABASE IF EXISTS idem_relay" -c "CREATE DATABASE idem_relay" >/dev/null
AMQP_URL=$("$ROOT/scripts/test-rabbitmq.sh" start "$work/rabbitmq" "$AMQP_PORT")
export AMQP_URL
(cd "$PEER" && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; })
idem_store="postgres://$PGUSER@$PGHOST:$PGPORT/idem_relay"
idem_to="amqp://idem:secret@127.0.0.1:$AMQP_PORT/"
rate_of() { sed -n 's/.* messages_per_s=\([0-9.]*\).*/\1/p' <<<"$1"; }

pto() { # MODE, then extra env; prints the info and result lines
  local mode=$1; shift
  env MODE="$mode" BATCH="$BATCH" POLL_MS="$POLL_MS" POOL="$POOL" "$@" RUNS=1 "$PEER/run.sh" \
    | grep -E '^(info: mode|peer=)'
}
idem_relay() {
  "$IDEM" bench relay --store "$idem_store" --to "$idem_to" --messages "$1" --keys "$K" \
    --payload-bytes "$PAYLOAD_BYTES" "${@:2}" | grep -E '^peer='
}

declare -a r_poll r_repl r_idem
for i in $(seq "$RUNS"); do
  echo "== round $i"
  out=$(pto polling); echo "$out"; r_poll+=("$(rate_of "$out")")
  out=$(pto replication); echo "$out"; r_repl+=("$(rate_of "$out")")
  if [ "$have_idem" = 1 ]; then out=$(idem_relay "$N"); echo "$out"; r_idem+=("$(rate_of "$out")"); fi
done

median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
m_poll=$(median "${r_poll[@]}"); m_repl=$(median "${r_repl[@]}")
best_mode=polling best=$m_poll
if awk -v a="$m_repl" -v b="$m_poll" 'BEGIN { exit !(a > b) }'; then best_mode=replication best=$m_repl; fi
echo "== medians of $RUNS (messages/s, N=$N K=$K payload=$PAYLOAD_BYTES)"
echo "pto-polling (batch=$BATCH poll_ms=$POLL_MS pool=$POOL): $m_poll  runs: ${r_poll[*]}"
echo "pto-replication (segment mutex, pool=$POOL): $m_repl  runs: ${r_repl[*]}"
if [ "$have_idem" = 1 ]; then
  m_idem=$(median "${r_idem[@]}")
  echo "idem-relay: $m_idem  runs: ${r_idem[*]}"
  awk -v a="$m_idem" -v b="$best" -v m="$best_mode" 'BEGIN { printf "ratio idem / pto-%s = %.1fx\n", m, a / b }'
else
  echo "idem-relay: skipped (no 'bench relay' in $IDEM)"
fi

echo "== latency at half the median rate ($LAT_SECONDS s of messages)"
for mode in polling replication; do
  m=$m_poll; [ "$mode" = replication ] && m=$m_repl
  rate=$(awk -v m="$m" 'BEGIN { printf "%d", m / 2 }')
  pto "$mode" RATE="$rate" N=$((rate * LAT_SECONDS))
done
if [ "$have_idem" = 1 ]; then
  if "$IDEM" bench relay --help 2>&1 | grep -q -- '--rate'; then
    rate=$(awk -v m="$m_idem" 'BEGIN { printf "%d", m / 2 }')
    idem_relay $((rate * LAT_SECONDS)) --rate "$rate"
  else
    echo "idem-relay latency: skipped ('bench relay' has no --rate)"
  fi
fi
