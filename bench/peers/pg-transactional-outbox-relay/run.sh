#!/usr/bin/env bash
# pg-transactional-outbox's outbox relayed to RabbitMQ (see README.md).
# Env: MODE=polling|replication (polling), N (20000), K (1000), PAYLOAD_BYTES (100),
#      RATE (0 = preloaded throughput; R = latency at R messages/s), PRODUCERS (16),
#      BATCH (16) and POLL_MS (10) for polling, POOL (16), RUNS (1), LOG=1.
# Servers: the shared peers' services.sh (PostgreSQL; started here with
# wal_level=logical unless already running) and a throwaway RabbitMQ
# (scripts/test-rabbitmq.sh on AMQP_PORT, 56741), unless AMQP_URL is given.
# PGDATABASE: its own database (pto_relay), created if missing.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
PEERS=${PEERS:-$ROOT/../shared/peers}
cd "$HERE"
[ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error
started_pg=0 started_mq=0
mq_state=${TMPDIR:-/tmp}/pto-relay-rabbitmq
cleanup() {
  if [ "$started_mq" = 1 ]; then "$ROOT/scripts/test-rabbitmq.sh" stop "$mq_state" || true; fi
  if [ "$started_pg" = 1 ]; then "$PEERS/services.sh" stop || true; fi
}
trap cleanup EXIT
status=$("$PEERS/services.sh" status)
if ! grep -q '^postgres: running' <<<"$status"; then
  PG_WAL_LEVEL=${PG_WAL_LEVEL:-logical} "$PEERS/services.sh" start
  started_pg=1
fi
eval "$("$PEERS/services.sh" env)"
if [ "${MODE:-polling}" = replication ] && [ "$(psql -d postgres -qAt -c 'show wal_level')" != logical ]; then
  echo "MODE=replication needs wal_level=logical: $PEERS/services.sh stop && PG_WAL_LEVEL=logical $PEERS/services.sh start" >&2
  exit 2
fi
export PGDATABASE=${PTO_DATABASE:-pto_relay}
psql -d postgres -qAt -c "SELECT 1 FROM pg_database WHERE datname = '$PGDATABASE'" | grep -q 1 \
  || psql -d postgres -qAt -c "CREATE DATABASE $PGDATABASE" >/dev/null
if [ -z "${AMQP_URL:-}" ]; then
  AMQP_URL=$("$ROOT/scripts/test-rabbitmq.sh" start "$mq_state" "${AMQP_PORT:-56741}")
  started_mq=1
fi
export AMQP_URL
for _ in $(seq "${RUNS:-1}"); do node harness.js; done
