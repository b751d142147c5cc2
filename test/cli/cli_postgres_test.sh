#!/usr/bin/env bash
# The idem command against the test PostgreSQL server: the demo with
# --store postgres:// (its second stage through the outbox), inspect, schema,
# purge, and bad URLs.
# usage: cli_postgres_test.sh IDEM_BINARY PG_URL
set -uo pipefail
IDEM=$1 URL=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0 pass=0
check() {
  local name=$1 want=$2; shift 2
  "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL $name: exit $rc, want $want"; head -5 "$T/out"; head -5 "$T/err"; fails=$((fails + 1)); return 1
  fi
  pass=$((pass + 1))
}
has() { if grep -qE -- "$3" "$2"; then pass=$((pass + 1)); else echo "FAIL $1: '$3' not in:"; head -5 "$2"; fails=$((fails + 1)); fi; }

check demo-postgres 0 "$IDEM" demo --store "$URL" --dir "$T/demo" --messages 400 --consumers 4 --json
has demo-ok "$T/out" '"ok":true'
has demo-charges "$T/out" '"charges":400,'
has demo-markers "$T/out" '"markers":400,'
has demo-shipments "$T/out" '"shipments":400,'
has demo-relay-killed "$T/out" '"relay_killed":true'
check inspect 0 "$IDEM" inspect --store "$URL" --consumer idem-demo --json
has inspect-count "$T/out" '"markers":400'
check schema 0 "$IDEM" schema --store "$URL" --json
has schema-kind "$T/out" '"store":"postgres","version":8'
check purge 0 "$IDEM" purge --store "$URL" --consumer idem-demo --older-than 0s --batch 100 --json
has purged "$T/out" '"purged":400'
check wrong-db 3 "$IDEM" inspect --store "${URL%/*}/no_such_database"
has wrong-db-named "$T/err" "no_such_database"
echo "cli-postgres: $pass passed, $fails failed"
[ "$fails" -eq 0 ]
