#!/usr/bin/env bash
# The two-phase mode side by side with @aws-lambda-powertools/idempotency in
# one round: the peers' services (PostgreSQL with fsync on; Redis without
# persistence, as the peers run it), then, RUNS times in turn:
#   Powertools makeIdempotent + its Redis persistence layer, EFFECT=counter
#   idem bench claims on the same Redis          (redis://.../2)
#   the same with --batch BATCH (8): CONCURRENCY/BATCH threads, each with
#     BATCH calls in flight through Claims::ClaimMany / CompleteMany
#   idem bench claims on the same PostgreSQL     (fsync on, synchronous_commit on)
#   idem bench claims on SQLite                  (WAL, synchronous=FULL, in $TMPDIR)
# Same workload everywhere: N unique keys (20000), each called DUP times (2),
# CONCURRENCY in flight (16); the result lines are the peers' own.
#   bench/peers/claims-vs-powertools.sh            # RUNS=3
#   RUNS=1 N=2000 bench/peers/claims-vs-powertools.sh
# Needs node/npm (the peer's npm ci) and redis-server (see the peers' README).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
PEERS=${PEERS:-$ROOT/../shared/peers}
[ -x "$IDEM" ] || { echo "build idem first (./run build): $IDEM" >&2; exit 2; }
[ -d "$PEERS" ] || { echo "no peers at $PEERS" >&2; exit 2; }
export N=${N:-20000} DUP=${DUP:-2} CONCURRENCY=${CONCURRENCY:-16}
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-claims.XXXXXX")
cp -r "$PEERS" "$work/"
P=$work/peers
chmod -R u+w "$P"
started=0
if ! "$P/services.sh" status | grep -q '^postgres: running'; then "$P/services.sh" start; started=1; fi
trap '[ $started = 1 ] && "$P/services.sh" stop; rm -rf "$work/sqlite"' EXIT
eval "$("$P/services.sh" env)"
(cd "$P/powertools-idempotency" && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; })
mkdir -p "$work/sqlite"
pg_url="postgres://$PGUSER@$PGHOST:$PGPORT/$PGDATABASE"
common=(--n "$N" --dup "$DUP" --concurrency "$CONCURRENCY")
for i in $(seq "${RUNS:-3}"); do
  echo "== round $i"
  # Powertools twice: DUP passes, then one pass (first calls only); the difference is its replay
  # pass, so its replays/s can be set next to idem's.
  full=$(cd "$P/powertools-idempotency" && EFFECT=counter RUNS=1 ./run.sh | grep -E '^(peer=|info:)')
  once=$(cd "$P/powertools-idempotency" && EFFECT=counter RUNS=1 DUP=1 ./run.sh | grep -E '^peer=')
  echo "$full"
  t_full=$(sed -n 's/.* seconds=\([0-9.]*\) .*/\1/p' <<<"$full")
  t_once=$(sed -n 's/.* seconds=\([0-9.]*\) .*/\1/p' <<<"$once")
  awk -v n="$N" -v d="$DUP" -v f="$t_full" -v o="$t_once" 'BEGIN {
    printf "powertools-derived: claims_per_s=%.1f replays_per_s=%.1f (one-pass run: %s s; replay passes: %.3f s)\n",
           n / o, (f > o ? n * (d - 1) / (f - o) : 0), o, f - o }'
  "$IDEM" bench claims --store "$REDIS_URL/2" "${common[@]}"
  "$IDEM" bench claims --store "$REDIS_URL/2" "${common[@]}" --batch "${BATCH:-8}"
  "$IDEM" bench claims --store "$pg_url" "${common[@]}"
  "$IDEM" bench claims --store "sqlite:$work/sqlite/claims-$i.db" "${common[@]}"
done
