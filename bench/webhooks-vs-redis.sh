#!/usr/bin/env bash
# Verified webhooks per second: idem's WebhookReceiver beside the usual
# hand-rolled receiver (the same Standard Webhooks signature check, then
# Redis SET NX EX for the dedup and the event's row in its own transaction),
# both on one SQLite file (WAL, synchronous=FULL: every event durable before
# its 200), in one run of `idem bench webhooks` (doc/performance.md).
# Starts its own redis-server (Debian's defaults: RDB snapshots, no AOF) on
# 127.0.0.1 in a temporary directory and stops it by its PID.
#   bench/webhooks-vs-redis.sh                        # 2000 events, 16 senders, 3 rounds
#   MESSAGES=5000 ROUNDS=5 bench/webhooks-vs-redis.sh --group-commit 32
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
[ -x "$IDEM" ] || { echo "build idem first (./run build): $IDEM" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "needs redis-server (./run deps tests)" >&2; exit 2; }
PORT=${REDIS_PORT:-26493}
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-webhooks.XXXXXX")
redis-server --bind 127.0.0.1 --port "$PORT" --dir "$work" --daemonize no --logfile "$work/redis.log" &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null; wait "$redis_pid" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
echo "# $(date -u +%FT%TZ) $(nproc) cores; git $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo ?)"
"$IDEM" bench webhooks --store "sqlite:$work/webhooks.db" --redis "redis://127.0.0.1:$PORT" \
  --messages "${MESSAGES:-2000}" --concurrency "${CONCURRENCY:-16}" --rounds "${ROUNDS:-3}" "$@"
