#!/usr/bin/env bash
# What the gateway adds to a request (issue 37's targets; doc/performance.md,
# "The gateway"): `idem bench gateway` on SQLite (a file in a temporary
# directory, synchronous FULL: every claim and completion fsynced) and on a
# throwaway PostgreSQL (scripts/test-postgres.sh, fsync on, a temporary
# directory on a free port of 127.0.0.1, stopped by its PID at the end). Each
# run is one process: the upstream, the gateway and the clients, direct and
# through the gateway in alternating rounds. Raw output in
# bench/results/gateway-<store>.txt.
#
#   bench/gateway-figures.sh [FLAGS of idem bench gateway...]
#     e.g. bench/gateway-figures.sh --rounds 5 --requests 4000
#
# Environment: IDEM (the command; default build/tools/idem/idem), OUT (the
# logs' directory, default bench/results), STORES (default "sqlite postgres"),
# PORT (PostgreSQL's: the first free one from there on; default 28000).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
OUT=${OUT:-$ROOT/bench/results}
STORES=${STORES:-sqlite postgres}
PORT=${PORT:-28000}
[ -x "$IDEM" ] || { echo "gateway-figures: no $IDEM (./run build)" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-gateway-figures.XXXXXX")
chmod 755 "$work"  # PostgreSQL runs as "postgres" and keeps its data in here
cleanup() {
  [ -d "$work/pg" ] && "$ROOT/scripts/test-postgres.sh" stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$OUT"
rc=0
for store in $STORES; do
  log="$OUT/gateway-$store.txt"
  case "$store" in
    sqlite) url="sqlite:$work/gateway.db" ;;
    postgres)
      url=$("$ROOT/scripts/test-postgres.sh" start "$work/pg" "$PORT") ;;
    *) echo "gateway-figures: STORES holds '$store': sqlite or postgres" >&2; exit 2 ;;
  esac
  {
    echo "# bench/gateway-figures.sh $* ($store)"
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -srm), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# idem $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet -- . ':!bench/results' 2>/dev/null || echo ' (modified)')"
    echo "# $IDEM bench gateway --store $url $*"
  } | tee "$log"
  "$IDEM" bench gateway --store "$url" "$@" 2>&1 | tee -a "$log" || rc=$?
  echo "gateway-figures: raw output in $log" >&2
done
exit "$rc"
