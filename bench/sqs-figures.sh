#!/usr/bin/env bash
# SQS (issue 36's target): the Consumer with the Inbox against a bare
# receive-and-delete loop on the same emulator, in batches of 10, side by
# side in one run (`idem bench source`: raw = Receive(10) + one
# DeleteMessageBatch per batch, no database; guarded = Consumer batch 10,
# Inbox on SQLite, one commit and one DeleteMessageBatch per batch).
# Starts fauxqs on 127.0.0.1 (scripts/test-sqs.sh) and stops it by PID.
#   bench/sqs-figures.sh                       # MESSAGES=5000 ROUNDS=3 WORKERS_LIST="4 8"
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
[ -x "$IDEM" ] || { echo "build idem first (./run build): $IDEM" >&2; exit 2; }
MESSAGES=${MESSAGES:-5000}
ROUNDS=${ROUNDS:-3}
WORKERS_LIST=${WORKERS_LIST:-4 8}
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-sqs-bench.XXXXXX")
cleanup() {
  "$ROOT/scripts/test-sqs.sh" stop "$work/sqs" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
endpoint=$("$ROOT/scripts/test-sqs.sh" start "$work/sqs" 58100 2>/dev/null)
# The emulator checks no signature.
export AWS_ACCESS_KEY_ID=AKIDBENCH AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
n=0
for workers in $WORKERS_LIST; do
for dup in 0 0.2; do
  "$IDEM" bench source --source "sqs://bench-$n-$$?endpoint=$endpoint&create_queue=true" \
    --store "sqlite:$work/s$n.db" --messages "$MESSAGES" --dup-rate "$dup" --workers "$workers" --batch 10 \
    --rounds "$ROUNDS" 2>/dev/null | sed "s|$work|\$TMP|g" | awk '{
      for (i = 1; i <= NF; i++) if ($i ~ /^ratio=/) { split($i, r, "="); printf "%s consumer/bare=%.2f\n", $0, 1 / r[2]; next }
      print }'
  n=$((n + 1))
done
done
