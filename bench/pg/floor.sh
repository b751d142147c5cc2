#!/usr/bin/env bash
# PostgreSQL's floor for idem's statements: pgbench sends the statements idem
# sends, at the same concurrency, on the same server, in the same run as idem
# itself, rounds alternating so that both see the same machine noise.
#
#   inbox   per message, C consumers (C pgbench clients):
#             pgbench bare     BEGIN; INSERT INTO bench_payments ...; COMMIT
#             pgbench guarded  BEGIN and the marker INSERT ... ON CONFLICT DO NOTHING in one
#                              pipelined flight; the same business INSERT; COMMIT
#             idem             `idem bench marker --batch 1 --consumers C` (its bare side is
#                              the first script through idem's Store, its guarded side
#                              Inbox::Handle, which sends the second)
#   http    first executions of POST /charges (every request a new key):
#             idem             `idem provider --one-transaction [--group-commit G --committers C]`
#                              on its own database, driven by wrk (16 keep-alive connections,
#                              bench/http/charges.lua), its mean group size read from /metrics
#             pgbench          what the provider sends for a group of that size, on C clients:
#                              BEGIN and the group's claim INSERTs in one pipelined flight, the
#                              group's charges in one multi-row INSERT and its completions
#                              (UPDATE ... RETURNING, the stored response) in one flight, COMMIT;
#                              requests/s = transactions/s x group size. Without --group-commit
#                              a group is one request, the read of its key comes first, and C is
#                              the connections (16).
#   relay   the outbox relay's store side (one relay holding all 64 lanes, batches of 500):
#             idem             `idem bench relay --to embedded:...`: rows through the store per
#                              second of the relay's store time (fetch, handed hint, settle;
#                              OutboxRelayStats::store_us), and end to end
#             pgbench          one client, synchronous_commit off like the relay, per
#                              transaction what a relay round sends: the fetch of the 500
#                              oldest rows, the lanes' handed-over hint (which returns the
#                              round's seqs), the move of those rows to idem_outbox_sent in one
#                              statement; over the same number of preloaded rows
#   claims  first calls of Claims::Claim + Complete outside a transaction (`idem bench claims`,
#             its first pass: claims_per_s, C threads) beside pgbench on C clients sending
#             what each first call sends: the insert that reads an existing row in the
#             same statement (its own commit), the completion (its own commit)
#
#   pooler  what a transaction pooler costs per statement idem sends (issue 34; `idem bench
#             pooler` measures idem itself): each statement of the inbox (the marker, the
#             business row) and of the provider (the read that answers a replay, a claim, a
#             group's charges, a completion) alone in a transaction rolled back, one pipelined
#             flight (BEGIN, the statement, ROLLBACK: no commit, one round trip), on 1 client,
#             three ways in turn: named (-M prepared, direct: prepared once per connection, as
#             idem sends direct), unnamed (-M extended, direct: parsed and planned at every
#             execution, as idem sends through a pooler) and pooled (-M extended through
#             POOLED_URL); then the same three ways the whole committed transactions at the
#             workload's concurrency: the inbox's guarded message on CONSUMERS clients, the
#             provider's group of GROUP first executions on 1 (its one committer). The tables
#             must exist (`idem bench pooler` makes them).
#
#   bench/pg/floor.sh inbox URL [CONSUMERS] [ROUNDS] [SECONDS]
#   bench/pg/floor.sh pooler URL POOLED_URL [ROUNDS] [SECONDS] [GROUP] [CONSUMERS]
#   bench/pg/floor.sh relay URL [ROUNDS] [MESSAGES]
#   bench/pg/floor.sh claims URL [CONCURRENCY] [ROUNDS] [N]
#   bench/pg/floor.sh http  URL [COMMITTERS] [ROUNDS] [N] [GROUP_COMMIT]   (GROUP_COMMIT 0: one transaction per request;
#                                                                           FIBERS=F in the environment: --fibers F)
# URL: postgres://USER@HOST:PORT/DB of a server with fsync on (scripts/test-postgres.sh
# starts one). `inbox` needs idem's markers retained in DB (`idem bench marker` writes them
# on its first run). Prints one line per side per round and the ratios; raw lines to stdout.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
part=${1:?inbox or http}; url=${2:?postgres://USER@HOST:PORT/DB}
# postgres://user@host:port/db
rest=${url#postgres://}; user=${rest%%@*}; rest=${rest#*@}; hostport=${rest%%/*}; db=${rest#*/}; db=${db%%\?*}
host=${hostport%%:*}; port=${hostport##*:}
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-floor.XXXXXX")
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
PSQL=("$PG_BIN/psql" -h "$host" -p "$port" -U "$user" -qAt)
now_ms="(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
# idem's statements, as pgbench sends them (:c, :kI are the script's variables).
# The inbox: its marker (time-ordered ids, as `--ids ordered`) and the business row.
marker_sql() {
  echo "INSERT INTO idem_markers(consumer, id, fingerprint, processed_at_ms) VALUES ('bench-ordered', convert_to(lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000000)::bigint), 16, '0') || substr(md5(random()::text), 1, 20), 'UTF8'), sha256(random()::text::bytea), $now_ms) ON CONFLICT DO NOTHING;"
}
business_sql() { echo "INSERT INTO bench_payments(message_id, cents) VALUES (md5(random()::text), :c);"; }
# The provider's: the read that answers a replay (key kI), a claim, the group's
# charges (keys k1..kG) in one multi-row INSERT, a completion (the stored
# response: status, headers and the charge's JSON, about 300 bytes).
peek_sql() {
  echo "SELECT state, fingerprint, fence, lease_until_ms, expires_at_ms, result, result_is_error, updated_at_ms, $now_ms FROM idem_claims WHERE scope = 'acct_bench|POST /charges' AND key = convert_to('k' || :k$1, 'UTF8');"
}
claim_sql() {
  echo "INSERT INTO idem_claims VALUES ('acct_bench|POST /charges', convert_to('k' || :k$1, 'UTF8'), 0, sha256(convert_to('f' || :k$1, 'UTF8')), nextval('idem_claim_fence'), $now_ms + 30000, 0, NULL, 0, $now_ms) ON CONFLICT DO NOTHING RETURNING fence, lease_until_ms;"
}
charges_sql() {
  local rows=() i joined
  for i in $(seq "$1"); do
    rows+=("('ch_' || lpad(to_hex($now_ms), 12, '0') || substr(md5(random()::text), 1, 12), 'acct_bench', 'k' || :k$i, 1000, 'usd', '', '', $now_ms)")
  done
  joined=$(printf ', %s' "${rows[@]}")
  echo "INSERT INTO provider_charges(id, principal, idem_key, amount, currency, customer, description, created_ms) VALUES ${joined:2};"
}
completion_sql() {
  echo "WITH u AS (UPDATE idem_claims SET state = 1, result = convert_to(repeat('r', 300), 'UTF8'), result_is_error = 0, expires_at_ms = $now_ms + 86400000, updated_at_ms = $now_ms WHERE scope = 'acct_bench|POST /charges' AND key = convert_to('k' || :k$1, 'UTF8') AND fence >= 0 AND state = 0 RETURNING waiters) SELECT CASE WHEN waiters > 0 THEN pg_notify('idem_claims', 'x') END FROM u;"
}
# pgbench_tps SCRIPT CLIENTS SECONDS DB: transactions per second.
pgbench_tps() {
  "$PG_BIN/pgbench" -n -M prepared -c "$2" -j "$2" -T "$3" -f "$1" -h "$host" -p "$port" -U "$user" "$4" 2>&1 |
    awk '/^tps =/ {printf "%.1f", $3}'
}

# The inbox's message, bare ($work/bare.sql) and guarded ($work/guarded.sql), as idem sends it.
inbox_scripts() {
  printf '%s\n' '\set c random(1, 1000000)' 'BEGIN;' "$(business_sql)" 'COMMIT;' >"$work/bare.sql"
  printf '%s\n' '\set c random(1, 1000000)' '\startpipeline' 'BEGIN;' "$(marker_sql)" \
    '\endpipeline' "$(business_sql)" 'COMMIT;' >"$work/guarded.sql"
}

inbox() {
  local consumers=${1:-4} rounds=${2:-3} seconds=${3:-6}
  inbox_scripts
  # idem's first run on the database writes its retained markers and the business table.
  "$IDEM" bench marker --store "$url" --ids ordered --batch 1 --consumers "$consumers" --json >/dev/null
  for r in $(seq "$rounds"); do
    local pb pg j
    pb=$(pgbench_tps "$work/bare.sql" "$consumers" "$seconds" "$db")
    pg=$(pgbench_tps "$work/guarded.sql" "$consumers" "$seconds" "$db")
    j=$("$IDEM" bench marker --store "$url" --ids ordered --batch 1 --consumers "$consumers" --json | tail -1)
    python3 - "$r" "$pb" "$pg" "$j" <<'EOF'
import json, sys
r, pb, pg, j = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
ib, ig = j["bare_per_s"], j["guarded_per_s"]
print(f"round={r} pgbench_bare_per_s={pb:.0f} pgbench_guarded_per_s={pg:.0f} idem_bare_per_s={ib:.0f} "
      f"idem_guarded_per_s={ig:.0f} idem_bare_over_guarded={ib / ig:.3f} pgbench_guarded_over_idem_guarded={pg / ig:.3f} "
      f"pgbench_bare_over_guarded={pb / pg:.3f}")
EOF
  done
}

# http_script FILE G [PEEK]: the provider's statements for a group of G first
# executions (PEEK=1: with the read of the key in front, as one transaction
# per request sends it; a group's reads go on the requests' own connections).
http_script() {
  local file=$1 g=$2 peek=${3:-0} i
  {
    for i in $(seq "$g"); do echo "\\set k$i random(1, 9000000000000000)"; done
    # One transaction per request: the read that answers a replay comes first, on the same connection.
    [ "$peek" = 1 ] && peek_sql 1
    echo '\startpipeline'
    echo 'BEGIN;'
    for i in $(seq "$g"); do claim_sql "$i"; done
    echo '\endpipeline'
    # The group's charges in one multi-row INSERT (the provider's InsertLater) ride with the
    # completions (InsertLater's rows are held back until the next statement).
    echo '\startpipeline'
    charges_sql "$g"
    for i in $(seq "$g"); do completion_sql "$i"; done
    echo '\endpipeline'
    echo 'COMMIT;'
  } >"$file"
}

http() {
  local committers=${1:-4} rounds=${2:-3} n=${3:-20000} group=${4:-64}
  command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk" >&2; exit 2; }
  local flags=(--quiet --one-transaction) clients=16
  if [ "$group" -gt 0 ]; then flags+=(--group-commit "$group" --committers "$committers"); clients=$committers; fi
  # FIBERS=F: the connections as fibers on F threads (with group commit).
  if [ "${FIBERS:-0}" -gt 0 ]; then flags+=(--fibers "$FIBERS"); fi
  local port_http=$((21000 + RANDOM % 1000))
  for r in $(seq "$rounds"); do
    local rdb="idem_floor_http_$r"
    "${PSQL[@]}" -d postgres -c "DROP DATABASE IF EXISTS $rdb" -c "CREATE DATABASE $rdb"
    "$IDEM" provider --listen "127.0.0.1:$port_http" --store "postgres://$user@$host:$port/$rdb" \
      --api-key sk_bench:acct_bench "${flags[@]}" &
    server_pid=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port_http/health" >/dev/null 2>&1 && break; sleep 0.1; done
    sync
    local out s
    out=$(K=$n TOTAL=$n API_KEY=sk_bench wrk -t1 -c16 -d600s --timeout 30s -s "$ROOT/bench/http/charges.lua" \
      "http://127.0.0.1:$port_http" 2>&1)
    s=$(grep -o 'elapsed_s=[0-9.]*' <<<"$out" | cut -d= -f2)
    local m commits grouped g
    m=$(curl -sf "http://127.0.0.1:$port_http/metrics")
    commits=$(awk '/^idem_http_group_commits_total/ {print $2}' <<<"$m")
    grouped=$(awk '/^idem_http_grouped_requests_total/ {print $2}' <<<"$m")
    kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=
    g=1
    if [ "$group" -gt 0 ] && [ "${commits:-0}" -gt 0 ]; then g=$(( (grouped + commits / 2) / commits )); fi
    [ "$g" -ge 1 ] || g=1
    http_script "$work/http.sql" "$g" "$([ "$group" -gt 0 ] && echo 0 || echo 1)"
    # pgbench on the same tables, in the same round's database.
    local tps
    tps=$(pgbench_tps "$work/http.sql" "$clients" 8 "$rdb")
    python3 - "$r" "$n" "$s" "$g" "$tps" "$clients" <<'EOF'
import sys
r, n, s, g, tps, c = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
idem = n / s
floor = tps * g
print(f"round={r} idem_first_per_s={idem:.0f} mean_group={g} pgbench_clients={c} pgbench_tps={tps:.0f} "
      f"pgbench_requests_per_s={floor:.0f} pgbench_over_idem={floor / idem:.3f}")
EOF
    "${PSQL[@]}" -d postgres -c "DROP DATABASE IF EXISTS $rdb"
  done
}

# claims_script FILE: what a first call of Claims::Claim + Complete sends
# outside a transaction: the insert that reads the row when the key is
# there already (its own commit), then the completion (its own commit).
claims_script() {
  local key="convert_to('00000000-0000-4000-8000-' || lpad(to_hex(:k::bigint), 12, '0'), 'UTF8')" scope="'bench-floor'"
  printf '%s\n' '\set k random(1, 200000000000000)' \
    "WITH ins AS (INSERT INTO idem_claims SELECT $scope, $key, 0, sha256($key), nextval('idem_claim_fence'), $now_ms + 60000, 0, NULL, 0, $now_ms WHERE NOT EXISTS (SELECT 1 FROM idem_claims WHERE scope = $scope AND key = $key) ON CONFLICT DO NOTHING RETURNING fence, lease_until_ms) SELECT NULL::integer, NULL::bytea, fence, lease_until_ms, NULL::bigint, NULL::bytea, NULL::integer, NULL::bigint, NULL::bigint, 1 FROM ins UNION ALL SELECT state, fingerprint, fence, lease_until_ms, expires_at_ms, result, result_is_error, updated_at_ms, $now_ms, 0 FROM idem_claims WHERE scope = $scope AND key = $key AND NOT EXISTS (SELECT 1 FROM ins);" \
    "WITH u AS (UPDATE idem_claims SET state = 1, result = convert_to('{\"n\":1}', 'UTF8'), result_is_error = 0, expires_at_ms = $now_ms + 3600000, updated_at_ms = $now_ms WHERE scope = $scope AND key = $key AND fence >= 0 AND state = 0 RETURNING waiters) SELECT CASE WHEN waiters > 0 THEN pg_notify('idem_claims', 'x') END FROM u;" \
    >"$1"
}

claims() {
  local concurrency=${1:-16} rounds=${2:-3} n=${3:-20000}
  claims_script "$work/claims.sql"
  for r in $(seq "$rounds"); do
    local out idem tps
    out=$("$IDEM" bench claims --store "$url" --n "$n" --dup 2 --concurrency "$concurrency" 2>&1)
    idem=$(grep -o 'claims_per_s=[0-9.]*' <<<"$out" | cut -d= -f2)
    [ -n "$idem" ] || { echo "$out" >&2; exit 1; }
    tps=$(pgbench_tps "$work/claims.sql" "$concurrency" 6 "$db")
    python3 - "$r" "$idem" "$tps" "$concurrency" <<'EOF'
import sys
r, idem, tps, c = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(f"round={r} concurrency={c} idem_claims_per_s={idem:.0f} pgbench_claims_per_s={tps:.0f} "
      f"pgbench_over_idem={tps / idem:.3f} idem_over_pgbench={idem / tps:.3f}")
EOF
  done
}

relay() {
  local rounds=${1:-3} n=${2:-50000} batch=500
  local lanes; lanes="'{$(seq -s, 0 63)}'::int[]"
  local oldest="SELECT lane, seq FROM idem_outbox WHERE lane = ANY($lanes) ORDER BY seq LIMIT $batch"
  local cols="seq, id, destination, ordering_key, payload, headers, producer_time_ms, added_at_ms"
  printf '%s\n' \
    "SELECT $cols, attempts, lane FROM idem_outbox WHERE lane = ANY($lanes) ORDER BY seq LIMIT $batch;" \
    "WITH f AS ($oldest), h AS (INSERT INTO idem_outbox_handed(lane, upto) SELECT lane, max(seq) FROM f GROUP BY lane ON CONFLICT (lane) DO UPDATE SET upto = GREATEST(idem_outbox_handed.upto, excluded.upto)) SELECT array_agg(seq)::text AS seqs FROM f \\gset" \
    "WITH moved AS (DELETE FROM idem_outbox WHERE seq = ANY(:seqs::bigint[]) RETURNING $cols) INSERT INTO idem_outbox_sent($cols, sent_at_ms) SELECT $cols, $now_ms FROM moved;" \
    >"$work/relay.sql"
  # Rows like idem's bench adds: 100 ordering keys, 100-byte payloads, a small header.
  local preload="INSERT INTO idem_outbox(seq, lane, id, destination, ordering_key, payload, headers, producer_time_ms, added_at_ms) SELECT nextval('idem_outbox_seq'), i % 64, convert_to('m' || i, 'UTF8'), '', convert_to('k' || (i % 100), 'UTF8'), convert_to(repeat('p', 100), 'UTF8'), convert_to(repeat('h', 70), 'UTF8'), $now_ms, $now_ms FROM generate_series(1, $n) i"
  for r in $(seq "$rounds"); do
    local j
    j=$("$IDEM" bench relay --store "$url" --to "embedded:$work/q$r.db" --messages "$n" --keys 100 \
      --payload-bytes 100 --batch "$batch" --json 2>/dev/null | tail -1)
    rm -f "$work/q$r.db"*
    "${PSQL[@]}" -d "$db" -c "$preload" -c "VACUUM ANALYZE idem_outbox"
    PGOPTIONS="-c synchronous_commit=off" "$PG_BIN/pgbench" -n -M prepared -c 1 -t $((n / batch)) \
      -f "$work/relay.sql" -h "$host" -p "$port" -U "$user" "$db" >"$work/pgbench.out" 2>&1 ||
      { cat "$work/pgbench.out" >&2; exit 1; }
    local left tps
    left=$("${PSQL[@]}" -d "$db" -c "SELECT count(*) FROM idem_outbox")
    tps=$(awk '/^tps =/ {printf "%.2f", $3}' "$work/pgbench.out")
    "${PSQL[@]}" -d "$db" -c "TRUNCATE idem_outbox_sent"
    python3 - "$r" "$j" "$tps" "$batch" "$left" <<'EOF'
import json, sys
r, j, tps, batch, left = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
idem = j["store_rows_per_s"]
floor = tps * batch
print(f"round={r} idem_store_rows_per_s={idem:.0f} idem_publish_rows_per_s={j['publish_rows_per_s']:.0f} "
      f"idem_relayed_per_s={j['relayed_per_s']:.0f} idem_end_to_end_per_s={j['messages_per_s']:.0f} "
      f"pgbench_rows_per_s={floor:.0f} "
      f"pgbench_over_idem_store={floor / idem:.3f} pgbench_rows_left={left}")
EOF
  done
}

# pgbench_run SCRIPT MODE PORT SECONDS CLIENTS: "TPS LATENCY_MS" of the script.
pgbench_run() {
  "$PG_BIN/pgbench" -n -M "$2" -c "$5" -j "$5" -T "$4" -f "$1" -h "$host" -p "$3" -U "$user" "$db" 2>&1 |
    awk '/^latency average/ {ms = $4} /^tps =/ {tps = $3} END {if (tps != "" && ms != "") print tps, ms}'
}

pooler() {
  local pooled=${1:?POOLED_URL} rounds=${2:-3} seconds=${3:-3} group=${4:-7} consumers=${5:-4} i st
  local pooled_port=${pooled#*@}; pooled_port=${pooled_port%%/*}; pooled_port=${pooled_port##*:}
  # Each statement alone: BEGIN, the statement, ROLLBACK in one flight, 1 client.
  local statements=(marker business peek claim charges completion)
  for st in "${statements[@]}"; do
    {
      echo '\set c random(1, 1000000)'
      for i in $(seq "$group"); do echo "\\set k$i random(1, 9000000000000000)"; done
      echo '\startpipeline'
      echo 'BEGIN;'
      case $st in
        peek | claim | completion) "${st}_sql" 1 ;;
        charges) charges_sql "$group" ;;
        *) "${st}_sql" ;;
      esac
      echo 'ROLLBACK;'
      echo '\endpipeline'
    } >"$work/$st.sql"
  done
  # Whole transactions, committed, at the workload's concurrency: the inbox's guarded
  # message on CONSUMERS clients, the provider's group of GROUP on 1 (one committer).
  inbox_scripts
  http_script "$work/group.sql" "$group" 0
  local named unnamed pooled_r
  measure() {  # SCRIPT CLIENTS LABEL
    named=$(pgbench_run "$1" prepared "$port" "$seconds" "$2")
    unnamed=$(pgbench_run "$1" extended "$port" "$seconds" "$2")
    pooled_r=$(pgbench_run "$1" extended "$pooled_port" "$seconds" "$2")
    [ -n "$named" ] && [ -n "$unnamed" ] && [ -n "$pooled_r" ] || { echo "pgbench failed on $3" >&2; exit 1; }
  }
  for r in $(seq "$rounds"); do
    for st in "${statements[@]}"; do
      measure "$work/$st.sql" 1 "$st"
      echo "round=$r statement=$st named_ms=${named#* } unnamed_ms=${unnamed#* } pooled_ms=${pooled_r#* }"
    done
    measure "$work/guarded.sql" "$consumers" inbox
    echo "round=$r transaction=inbox clients=$consumers named_per_s=${named% *} unnamed_per_s=${unnamed% *} pooled_per_s=${pooled_r% *}"
    measure "$work/group.sql" 1 group
    echo "round=$r transaction=group$group clients=1 named_per_s=${named% *} unnamed_per_s=${unnamed% *} pooled_per_s=${pooled_r% *}"
  done | tee "$work/pooler.out"
  # The medians over the rounds.
  python3 - "$work/pooler.out" "$group" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = dict(kv.split("=") for kv in line.split())
    rows.setdefault(("statement", f["statement"]) if "statement" in f else ("transaction", f["transaction"]), []).append(f)
for (kind, name), fs in rows.items():
    unit = "ms" if kind == "statement" else "per_s"
    med = {k: statistics.median(float(f[f"{k}_{unit}"]) for f in fs) for k in ("named", "unnamed", "pooled")}
    if kind == "statement":
        name = f"charges({sys.argv[2]}_rows)" if name == "charges" else name
        print(f"median statement={name} named_ms={med['named']:.3f} unnamed_ms={med['unnamed']:.3f} "
              f"pooled_ms={med['pooled']:.3f} unnamed_extra_us={(med['unnamed'] - med['named']) * 1000:.0f} "
              f"pooler_hop_us={(med['pooled'] - med['unnamed']) * 1000:.0f}")
    else:
        print(f"median transaction={name} clients={fs[0]['clients']} named_per_s={med['named']:.0f} "
              f"unnamed_per_s={med['unnamed']:.0f} pooled_per_s={med['pooled']:.0f} "
              f"unnamed_over_named={med['unnamed'] / med['named']:.3f} pooled_over_named={med['pooled'] / med['named']:.3f}")
EOF
}

case $part in
  inbox) inbox "${@:3}" ;;
  pooler) pooler "${@:3}" ;;
  http) http "${@:3}" ;;
  relay) relay "${@:3}" ;;
  claims) claims "${@:3}" ;;
  *) echo "usage: bench/pg/floor.sh inbox|http|relay|claims|pooler URL ..." >&2; exit 2 ;;

esac
