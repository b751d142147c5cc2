#!/usr/bin/env bash
# idem's guarded handling on DynamoDB against AWS Powertools' idempotency
# utility (TypeScript, DynamoDB persistence layer) on the same DynamoDB Local,
# the same items (one per message) and the same concurrency, alternating
# rounds. Prints each side's rate per round and the median ratio.
#   bench/dynamodb-vs-powertools.sh BUILD_DIR [MESSAGES=2000] [CONCURRENCY=8] [ROUNDS=3]
# Starts its own DynamoDB Local (scripts/test-dynamodb.sh) and installs the
# npm packages into ${IDEM_EMULATORS_DIR:-.emulators}/powertools when missing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$1" && pwd) N=${2:-2000} C=${3:-8} ROUNDS=${4:-3}
EMU=${IDEM_EMULATORS_DIR:-$ROOT/.emulators}
PT=$EMU/powertools
if [ ! -d "$PT/node_modules/@aws-lambda-powertools/idempotency" ]; then
  mkdir -p "$PT"
  # The AWS SDK packages are served at differing versions: unpinned, as npm resolves them.
  npm install --no-audit --no-fund --silent --prefix "$PT" @aws-lambda-powertools/idempotency@2.35.0 \
    @aws-sdk/client-dynamodb @aws-sdk/lib-dynamodb >&2
fi
cp "$ROOT/bench/dynamodb-vs-powertools.mjs" "$PT/"
STATE=$(mktemp -d)
trap '"$ROOT/scripts/test-dynamodb.sh" stop "$STATE" 2>/dev/null; rm -rf "$STATE"' EXIT
URL=$("$ROOT/scripts/test-dynamodb.sh" start "$STATE" 28400 2>/dev/null)
ratios=()
for r in $(seq "$ROUNDS"); do
  pt=$(cd "$PT" && NODE_NO_WARNINGS=1 node dynamodb-vs-powertools.mjs "$URL" "$N" "$C" "$r" 2>/dev/null | grep -o '"msg_per_s":[0-9]*' | cut -d: -f2)
  idem=$("$BUILD/bench/idem_dynamodb_guarded" "$URL" "$N" "$C" 1 1 | grep -o 'guarded [0-9]* msg/s' | awk '{print $2}')
  ratio=$(awk -v a="$idem" -v b="$pt" 'BEGIN { printf "%.2f", a / b }')
  echo "round $r: powertools $pt msg/s, idem guarded $idem msg/s, idem/powertools $ratio"
  ratios+=("$ratio")
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
echo "{\"messages\":$N,\"concurrency\":$C,\"rounds\":$ROUNDS,\"median_idem_over_powertools\":$median}"
