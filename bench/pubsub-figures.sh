#!/usr/bin/env bash
# Issue 36's Pub/Sub target: idem's Consumer (Inbox on SQLite, batches) against
# a bare pull-handle-ack loop on the same Pub/Sub emulator, side by side in
# one run (bench/pubsub_consumer.cc). Starts a throwaway emulator on
# 127.0.0.1 (scripts/test-pubsub.sh) and stops it by PID.
#   bench/pubsub-figures.sh                     # MESSAGES=10000 BATCH=100 ROUNDS=9
#   MESSAGES=2000 ROUNDS=1 bench/pubsub-figures.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=${BENCH:-$ROOT/build/bench/idem_pubsub_consumer_bench}
[ -x "$BENCH" ] || { echo "build it first (cmake --build build --target idem_pubsub_consumer_bench): $BENCH" >&2; exit 2; }
MESSAGES=${MESSAGES:-10000}
BATCH=${BATCH:-100}
ROUNDS=${ROUNDS:-9}
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-pubsub-bench.XXXXXX")
cleanup() {
  "$ROOT/scripts/test-pubsub.sh" stop "$work/emulator" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
endpoint=$("$ROOT/scripts/test-pubsub.sh" start "$work/emulator" "${PORT:-28290}")
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nproc) cores; emulator $(basename "$(ls /usr/lib/google-cloud-sdk/platform/pubsub-emulator/lib/cloud-pubsub-emulator-*.jar 2>/dev/null | head -1)" .jar)"
echo "# $BENCH $endpoint $MESSAGES $BATCH $ROUNDS"
"$BENCH" "$endpoint" "$MESSAGES" "$BATCH" "$ROUNDS" "$work" 2>&1
