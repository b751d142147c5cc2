#!/usr/bin/env bash
# idem's Inbox on the DynamoDB store side by side with AWS Powertools'
# idempotency utility (@aws-lambda-powertools/idempotency with its DynamoDB
# persistence layer, bench/peers/powertools-dynamodb) on one DynamoDB Local,
# in one run: RUNS rounds, each
#   Powertools makeIdempotent, its handler writing one payments item (PutItem)
#   idem bench peers on dynamodb:// (the Inbox: the item and the marker in one
#     TransactWriteItems)
#   the same with --batch BATCH (8)
# Same workload everywhere: N unique message ids (2000), each delivered DUP
# times (2), CONCURRENCY in flight (16); the result lines are the peers' own
# (deliveries_per_s: higher is better).
#   bench/peers/dynamodb-vs-powertools.sh
#   RUNS=1 N=500 bench/peers/dynamodb-vs-powertools.sh
# Needs node/npm and Java 17 (DynamoDB Local: scripts/test-dynamodb.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
PEER=$ROOT/bench/peers/powertools-dynamodb
[ -x "$IDEM" ] || { echo "build idem first (./run build): $IDEM" >&2; exit 2; }
export N=${N:-2000} DUP=${DUP:-2} CONCURRENCY=${CONCURRENCY:-16}
# DynamoDB Local takes any credentials whose key id is letters and digits.
export AWS_ACCESS_KEY_ID=idem AWS_SECRET_ACCESS_KEY=idem AWS_REGION=us-east-1
state=$(mktemp -d "${TMPDIR:-/tmp}/idem-ddb-bench.XXXXXX")
trap '"$ROOT/scripts/test-dynamodb.sh" stop "$state" >/dev/null 2>&1 || true; rm -rf "$state"' EXIT
endpoint=$("$ROOT/scripts/test-dynamodb.sh" start "$state" "${PORT:-28390}")
(cd "$PEER" && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; })
common=(--n "$N" --dup "$DUP" --concurrency "$CONCURRENCY")
for i in $(seq "${RUNS:-3}"); do
  echo "== round $i"
  (cd "$PEER" && DDB_ENDPOINT=$endpoint PREFIX="pt$i" MODE=powertools node harness.js)
  "$IDEM" bench peers --store "dynamodb://idem-peers-$i?endpoint=$endpoint" "${common[@]}"
  "$IDEM" bench peers --store "dynamodb://idem-peers-batch-$i?endpoint=$endpoint" "${common[@]}" --batch "${BATCH:-8}"
done
