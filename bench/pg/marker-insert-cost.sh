#!/usr/bin/env bash
# Issue #4: what one marker INSERT costs on PostgreSQL by itself, with no idem code in the way.
#
# pgbench runs three transactions, one client, alternating rounds:
#   bare      BEGIN; INSERT INTO bench_payments ...; COMMIT                       (3 round trips)
#   guarded   BEGIN and the marker INSERT in one pipelined flight; the same business
#             INSERT; COMMIT                                      (3 round trips, as Inbox::Handle)
#   select    the same flights with the marker INSERT replaced by a SELECT of the same
#             values (what the flight costs without the insert)
# and prints transactions/s and bare/guarded. Run it against a database where
# `idem bench marker --store postgres://... --ids ordered --batch 1` has retained its markers
# (the tables idem_markers and bench_payments must exist).
#
#   bench/pg/marker-insert-cost.sh 127.0.0.1 55441 postgres idem_test [ROUNDS] [SECONDS]
set -euo pipefail
host=${1:?host}; port=${2:?port}; user=${3:?user}; db=${4:?database}
rounds=${5:-3}; seconds=${6:-6}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
values="'bench-ordered', convert_to(lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000000)::bigint), 16, '0') || substr(md5(random()::text), 1, 20), 'UTF8'), sha256(random()::text::bytea), (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
business="INSERT INTO bench_payments(message_id, cents) VALUES (md5(random()::text), :c);"
printf '%s\n' '\set c random(1, 1000000)' 'BEGIN;' "$business" 'COMMIT;' >"$work/bare.sql"
printf '%s\n' '\set c random(1, 1000000)' '\startpipeline' 'BEGIN;' \
  "INSERT INTO idem_markers(consumer, id, fingerprint, processed_at_ms) VALUES ($values) ON CONFLICT DO NOTHING;" \
  '\endpipeline' "$business" 'COMMIT;' >"$work/guarded.sql"
printf '%s\n' '\set c random(1, 1000000)' '\startpipeline' 'BEGIN;' "SELECT $values;" \
  '\endpipeline' "$business" 'COMMIT;' >"$work/select.sql"
tps() { "$PG_BIN/pgbench" -n -M prepared -c 1 -T "$seconds" -f "$work/$1.sql" -h "$host" -p "$port" -U "$user" "$db" 2>&1 |
          awk '/^tps =/ {printf "%.0f", $3}'; }
echo "round bare/s guarded/s select/s bare/guarded bare/select"
for r in $(seq 1 "$rounds"); do
  b=$(tps bare); g=$(tps guarded); s=$(tps select)
  awk -v r="$r" -v b="$b" -v g="$g" -v s="$s" 'BEGIN {printf "%d %d %d %d %.3f %.3f\n", r, b, g, s, b / g, b / s}'
done
