#!/usr/bin/env bash
# Claims on PostgreSQL beside pgbench sending the same statements, in one run
# on one throwaway server (scripts/test-postgres.sh: 127.0.0.1, the first free
# port from PG_PORT, fsync on, synchronous_commit on; stopped by its PID).
#
# Each round, in turn (bench/pg/floor.sh claims, one round each):
#   idem     `idem bench claims --n N --dup 2 --concurrency C`: its first pass,
#            C threads each calling Claims::Claim then Complete on new keys
#            (claims_per_s); the store opened with one connection per thread
#            (?idem_pool_size=C), as pgbench has one per client
#   pgbench  C clients, each transaction the statements a first call sends:
#            the claim's insert-or-read, then the completion, each committed
#            on its own (-M prepared)
#   BASE=PATH  also another idem binary (an earlier build), on its own side
# and prints idem / pgbench per round, then the medians.
#
#   bench/claims-vs-pgbench.sh [CONCURRENCY] [ROUNDS] [N]      # 16 5 20000
#   BASE=/tmp/idem-before bench/claims-vs-pgbench.sh 64 5
#   POOL=8 bench/claims-vs-pgbench.sh 16                      # idem's default pool instead
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
[ -x "$IDEM" ] || { echo "build idem first (./run build): $IDEM" >&2; exit 2; }
[ -x "$PG_BIN/pgbench" ] || { echo "pgbench missing under $PG_BIN (apt-get install postgresql-15)" >&2; exit 2; }
concurrency=${1:-16} rounds=${2:-5} n=${3:-20000}
pool=${POOL:-$concurrency}
state=$(mktemp -d "${TMPDIR:-/tmp}/idem-claims-pgbench.XXXXXX")
trap '"$ROOT/scripts/test-postgres.sh" stop "$state/pg" 2>/dev/null; rm -rf "$state"' EXIT
url=$("$ROOT/scripts/test-postgres.sh" start "$state/pg" "${PG_PORT:-26010}")
echo "# $(date -u +%FT%TZ) $(nproc) cores, $("$PG_BIN/postgres" --version), fsync=on synchronous_commit=on;" \
  "concurrency=$concurrency pool=$pool rounds=$rounds n=$n idem=$IDEM${BASE:+ base=$BASE}"
# idem's first run makes the tables (its migrations).
"$IDEM" bench claims --store "$url" --n 100 --dup 1 --concurrency 1 >/dev/null
sides=(idem); [ -n "${BASE:-}" ] && sides+=(base)
for r in $(seq "$rounds"); do
  for side in "${sides[@]}"; do
    bin=$IDEM; [ "$side" = base ] && bin=$BASE
    IDEM=$bin "$ROOT/bench/pg/floor.sh" claims "$url?idem_pool_size=$pool" "$concurrency" 1 "$n" |
      sed "s/^round=1 /round=$r side=$side /"
  done
done | tee "$state/rounds"
python3 - "$state/rounds" "${sides[@]}" <<'EOF2'
import statistics, sys
rows = [dict(kv.split("=") for kv in line.split()) for line in open(sys.argv[1]) if line.startswith("round=")]
for side in sys.argv[2:]:
    fs = [f for f in rows if f["side"] == side]
    r = [float(f["idem_over_pgbench"]) for f in fs]
    idem = statistics.median(float(f["idem_claims_per_s"]) for f in fs)
    pg = statistics.median(float(f["pgbench_claims_per_s"]) for f in fs)
    print(f"median side={side} idem_claims_per_s={idem:.0f} pgbench_claims_per_s={pg:.0f} "
          f"idem_over_pgbench={statistics.median(r):.3f} range={min(r):.3f}-{max(r):.3f}")
EOF2
