#!/usr/bin/env bash
# What the guard and the store cost on top of each broker: `idem bench source`
# for every source x store x duplicate rate, each line the broker's own
# consume-and-ack rate (no database) next to the guarded consumer in one run.
# Starts throwaway servers on 127.0.0.1 (PostgreSQL, Redis, RabbitMQ; Kafka is
# librdkafka's mock cluster inside the process) and stops them by PID.
#   bench/sources-figures.sh                    # MESSAGES=10000 ROUNDS=3
#   MESSAGES=2000 ROUNDS=1 bench/sources-figures.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
[ -x "$IDEM" ] || { echo "build idem first (./run build): $IDEM" >&2; exit 2; }
MESSAGES=${MESSAGES:-10000}
ROUNDS=${ROUNDS:-3}
WORKERS=${WORKERS:-4}
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-sources.XXXXXX")
chmod 755 "$work"
cleanup() {
  "$ROOT/scripts/test-rabbitmq.sh" stop "$work/rmq" >/dev/null 2>&1 || true
  "$ROOT/scripts/test-redis.sh" stop "$work/redis" >/dev/null 2>&1 || true
  "$ROOT/scripts/test-postgres.sh" stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
pg=$("$ROOT/scripts/test-postgres.sh" start "$work/pg" 55481)
redis=$("$ROOT/scripts/test-redis.sh" start "$work/redis" 56383)
amqp=$("$ROOT/scripts/test-rabbitmq.sh" start "$work/rmq" 56741)
n=0
for src in "embedded:$work/q.db?queue=bench" "$redis/0?stream=bench" "$amqp?queue=bench" "kafka-mock:?topic=bench"; do
  for store in "sqlite:$work/s$n.db" "$pg"; do
    for dup in 0 0.2; do
      "$IDEM" bench source --source "$src" --store "$store" --messages "$MESSAGES" --dup-rate "$dup" \
        --workers "$WORKERS" --rounds "$ROUNDS" 2>/dev/null | sed "s|$work|\$TMP|g"
      n=$((n + 1))
    done
  done
done
