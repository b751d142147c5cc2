#!/usr/bin/env bash
# PostgreSQL through pgbouncer in transaction mode beside the same server
# reached directly (issue 34; doc/performance.md, "Behind pgbouncer"): starts
# a throwaway PostgreSQL (scripts/test-postgres.sh, fsync on) and pgbouncer
# in front of it (scripts/test-pgbouncer.sh, pool_mode=transaction) in
# temporary directories on free ports of 127.0.0.1, runs `idem bench pooler`
# (both workloads, sides alternating in one run), then the server's and the
# pooler's part per statement (bench/pg/floor.sh pooler: each statement idem
# sends, named, unnamed and through the pooler, by pgbench), stops both by
# their PIDs, and writes the raw output to the log.
#
#   bench/pooler-figures.sh [FLAGS of idem bench pooler...]
#     e.g. bench/pooler-figures.sh --rounds 7 --seconds 3 --unnamed
#
# Environment: IDEM (the command; default build/tools/idem/idem), LOG (default
# bench/results/pooler-ab-DATE.log), PORTS (the range to take free
# ports from; default 28000-28999), FLOOR (rounds of the per-statement part,
# default 3; 0: none), GROUP (its group of charges, default 7).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
LOG=${LOG:-$ROOT/bench/results/pooler-ab-$(date -u +%F).log}
PORTS=${PORTS:-28000-28999}
[ -x "$IDEM" ] || { echo "pooler-figures: no $IDEM (./run build)" >&2; exit 2; }

# free_port FROM TO [NOT]: the first port of the range nothing listens on (but NOT).
free_port() {
  local p
  for p in $(seq "$1" "$2"); do
    [ "$p" = "${3:-}" ] && continue
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  echo "pooler-figures: no free port in $1-$2" >&2
  return 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-pooler-ab.XXXXXX")
chmod 755 "$work"  # pgbouncer runs as "postgres" and keeps its state in here
cleanup() {
  "$ROOT/scripts/test-pgbouncer.sh" stop "$work/pgbouncer" || true
  "$ROOT/scripts/test-postgres.sh" stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT

from=${PORTS%-*} to=${PORTS#*-}
pg_port=$(free_port "$from" "$to")
direct=$("$ROOT/scripts/test-postgres.sh" start "$work/pg" "$pg_port")
bouncer_port=$(free_port "$from" "$to" "$pg_port")
pooled=$("$ROOT/scripts/test-pgbouncer.sh" start "$work/pgbouncer" "$bouncer_port" "$work/pg")

# CPU seconds (user + system) a process has used so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
bouncer_pid=$(cat "$work/pgbouncer/pid")

mkdir -p "$(dirname "$LOG")"
{
  echo "# bench/pooler-figures.sh $*"
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -srm), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $("$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)/postgres" --version), $(pgbouncer --version 2>/dev/null | head -1 || /usr/sbin/pgbouncer --version | head -1)"
  echo "# pgbouncer: pool_mode=transaction, default_pool_size=8 (scripts/test-pgbouncer.sh)"
  echo "# idem $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (modified)')"
  echo "# $IDEM bench pooler --direct $direct --pooled $pooled $*"
} | tee "$LOG"
cpu0=$(cpu_s "$bouncer_pid")
rc=0
"$IDEM" bench pooler --direct "$direct" --pooled "$pooled" "$@" 2>&1 | tee -a "$LOG" || rc=$?
echo "# pgbouncer used $(awk -v a="$cpu0" -v b="$(cpu_s "$bouncer_pid")" 'BEGIN {printf "%.1f", b - a}') CPU seconds during the run" |
  tee -a "$LOG"
if [ "$rc" = 0 ] && [ "${FLOOR:-3}" -gt 0 ]; then
  echo "# $ROOT/bench/pg/floor.sh pooler $direct $pooled ${FLOOR:-3} 2 ${GROUP:-7}" | tee -a "$LOG"
  "$ROOT/bench/pg/floor.sh" pooler "$direct" "$pooled" "${FLOOR:-3}" 2 "${GROUP:-7}" 2>&1 | tee -a "$LOG" || rc=$?
fi
echo "pooler-figures: raw output in $LOG" >&2
exit "$rc"
