#!/usr/bin/env bash
# idem run on DynamoDB: 200 payments published to the embedded queue, 60 of
# them twice, drained by 4 workers in batches of 10 into a dynamodb:// store
# (the fixture's DynamoDB Local): every message applied once, every copy a
# duplicate, nothing failed, and the effect table holds 200 items; idem
# inspect reads the markers back.
# usage: cli_run_test.sh IDEM SERVERS_DIR
set -euo pipefail
IDEM=$1 URL=$(cat "$2/dynamodb-test/url")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }
# A key of its own (tables of its own); DynamoDB Local takes only letters and digits.
export AWS_ACCESS_KEY_ID=idemcli$$ AWS_SECRET_ACCESS_KEY=secret
STORE="dynamodb://cli-run?region=us-east-1&endpoint=$URL"
"$IDEM" publish --source "embedded:$T/q.db" --messages 200 --dup-rate 0.3 --json >"$T/pub" || fail "publish"
"$IDEM" run --source "embedded:$T/q.db" --store "$STORE" --drain --workers 4 --batch 10 --json >"$T/run" 2>"$T/err" \
  || { cat "$T/err" >&2; fail "idem run"; }
grep -q '"applied":200,"duplicates":60,"conflicts":0,"failures":0' "$T/run" || { cat "$T/run" >&2; fail "counts"; }
items=$(curl -s -X POST "$URL/" -H 'Content-Type: application/x-amz-json-1.0' \
  -H 'X-Amz-Target: DynamoDB_20120810.Scan' \
  -H "Authorization: AWS4-HMAC-SHA256 Credential=$AWS_ACCESS_KEY_ID/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=00" \
  -d '{"TableName":"idem_run_payments","Select":"COUNT"}')
echo "$items" | grep -q '"Count":200' || fail "the effect table holds $items, not 200 items"
"$IDEM" inspect --store "$STORE" >"$T/inspect" || fail "inspect"
grep -q "^markers: 200" "$T/inspect" || { cat "$T/inspect" >&2; fail "inspect: markers"; }
echo "ok: idem run on DynamoDB: 200 applied once, 60 duplicates, 200 items; idem inspect reads 200 markers"
