#!/usr/bin/env bash
# The idem command against the test PostgreSQL server: the demo with
# --store postgres:// (its second stage through the outbox), inspect, schema,
# purge, bad URLs, and the gateway's connections to PostgreSQL.
# usage: cli_postgres_test.sh IDEM_BINARY PG_URL
set -uo pipefail
IDEM=$1 URL=$2
T=$(mktemp -d)
GPID=
trap '[ -n "$GPID" ] && kill "$GPID" 2>/dev/null; rm -rf "$T"' EXIT
fails=0 pass=0
# shellcheck source=checks.sh
source "$(dirname "$0")/checks.sh"

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
# idem gateway on PostgreSQL: a connection per thread, up to 32, unless the
# URL names a pool size (its start-up line says how many).
gateway_connections() {  # gateway_connections NAME WANT STORE_URL [FLAGS...]
  local name=$1 want=$2 url=$3; shift 3
  local port; port=$(free_port 28600 100)
  "$IDEM" gateway --upstream http://127.0.0.1:9 --listen "127.0.0.1:$port" --store "$url" "$@" 2>"$T/gw.log" &
  GPID=$!
  for _ in $(seq 300); do
    grep -q "serving" "$T/gw.log" 2>/dev/null && break
    kill -0 "$GPID" 2>/dev/null || break
    sleep 0.1
  done
  kill "$GPID" 2>/dev/null; wait "$GPID"; GPID=
  has "$name" "$T/gw.log" "serving http://127.0.0.1:$port in front of http://127.0.0.1:9 \\(store postgres, $want connections\\)"
}
sep='?'; case "$URL" in *\?*) sep='&' ;; esac
gateway_connections gateway-default-pool 32 "$URL"
gateway_connections gateway-pool-per-thread 4 "$URL" --threads 4
gateway_connections gateway-pool-from-url 5 "$URL${sep}idem_pool_size=5" --threads 64
echo "cli-postgres: $pass passed, $fails failed"
[ "$fails" -eq 0 ]
