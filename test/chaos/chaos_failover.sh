#!/usr/bin/env bash
# idem chaos across primary failovers of a 2-node Patroni + etcd cluster:
#   chaos_failover.sh IDEM sync|async BASEPORT FAILOVERS [URL-QUERY] [idem chaos flags...]
# starts the cluster (scripts/test-patroni.sh, synchronous_mode true for
# sync, false for async: the control) in a temporary directory on free
# ports from BASEPORT (27000-27999; moved up when taken), then runs idem chaos
# with --store and --provider-store both on the cluster's multi-host URL
# (target_session_attrs=read-write; URL-QUERY, e.g. idem_ack_after=standby_flush,
# is added to it) and --fault-cmd: FAILOVERS failovers while consumers and
# the provider are killed as usual, alternating a SIGKILL of the primary's
# postmaster and a SIGKILL of the primary's Patroni (restarted once the other
# node is primary). Each failover waits until the other node accepts writes,
# measures the recovery (from the kill to the first effect committed on the
# new primary after its promotion) and waits until the old primary is back
# as a standby (a synchronous one in sync mode) before the next may begin.
# Prints idem chaos's JSON line (with fault_runs and fault_recovery_*), then
# a summary line. Exit status: idem chaos's in sync mode; in async mode 0
# when the run completed with every failover (its losses are reported, not
# failed on). The cluster is stopped by PID at the end; the temporary
# directory is kept when the run failed.
#   (internal) chaos_failover.sh --fault CLUSTER-DIR sync|async: one failover;
#   IDEM_CHAOS_FAULT (from idem chaos) numbers it: even kills the postmaster,
#   odd the Patroni.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HA=$ROOT/scripts/test-patroni.sh
SELF=$ROOT/test/chaos/chaos_failover.sh
now_ms() { date +%s%3N; }
# sql PORT QUERY: one value from the node on 127.0.0.1:PORT ("" when it does not answer).
sql() { PGCONNECT_TIMEOUT=3 psql -h 127.0.0.1 -p "$1" -U postgres -d postgres -Atqc "$2" 2>/dev/null || true; }

fault() {
  local dir=$1 mode=$2 n=${IDEM_CHAOS_FAULT:-0} base old new kind t0 t_promoted t_recovered t_healthy c0 c
  base=$(cat "$dir/baseport")
  port() { echo $((base + 10 + ${1#n})); }
  say() { echo "chaos_failover.sh fault $n: $*" >&2; }
  cluster() { curl -s "http://127.0.0.1:$((base + 21))/cluster" 2>/dev/null || curl -s "http://127.0.0.1:$((base + 22))/cluster" 2>/dev/null || true; }
  # standby_ok PRIMARY STANDBY: the standby streams from the primary and
  # Patroni would fail over to it. Sync mode: the primary waits for it
  # (sync_state) and the cluster's /sync key in etcd names it (GET /sync
  # answers 200 on it): Patroni promotes only a standby that key names, so a
  # primary's Patroni killed between the two leaves no failover at all.
  standby_ok() {
    local want="state = 'streaming'" check=replica
    [ "$mode" = sync ] && want="$want AND sync_state = 'sync'" check=sync
    [ "$(sql "$(port "$1")" "SELECT count(*) FROM pg_stat_replication WHERE application_name = '$2' AND $want")" = 1 ] &&
      curl -fs "http://127.0.0.1:$((base + 20 + ${2#n}))/$check" >/dev/null 2>&1
  }
  wait_for() { # SECONDS WHAT COMMAND...: polls every 50 ms
    local secs=$1 what=$2 deadline
    shift 2
    deadline=$(($(now_ms) + secs * 1000))
    until "$@"; do
      if [ "$(now_ms)" -gt "$deadline" ]; then
        say "no $what after ${secs}s; cluster: $(cluster)"
        exit 1
      fi
      sleep 0.05
    done
  }
  old=$(bash "$HA" primary "$dir" 60)
  new=n1
  [ "$old" = n1 ] && new=n2
  wait_for 120 "healthy standby $new of $old" standby_ok "$old" "$new"
  kind=kill-postmaster
  [ $((n % 2)) = 1 ] && kind=kill-patroni
  t0=$(now_ms)
  bash "$HA" "$kind" "$dir" "$old"
  promoted() { [ "$(sql "$(port "$new")" "SELECT pg_is_in_recovery()")" = f ]; }
  wait_for 90 "promotion of $new" promoted
  t_promoted=$(now_ms)
  # Patroni comes back (as a service manager would restart it): it finds
  # the other node leading and makes its PostgreSQL a standby (pg_rewind).
  [ "$kind" = kill-patroni ] && bash "$HA" restart-patroni "$dir" "$old"
  # Recovery: the first effect committed on the new primary after its
  # promotion (its effect rows counted now, then until one more).
  c0=$(sql "$(port "$new")" "SELECT count(*) FROM chaos_payments")
  committed() {
    c=$(sql "$(port "$new")" "SELECT count(*) FROM chaos_payments")
    [ -n "$c" ] && [ -n "$c0" ] && [ "$c" -gt "$c0" ]
  }
  wait_for 120 "effect committed on the new primary $new" committed
  t_recovered=$(now_ms)
  wait_for 180 "old primary $old back as a standby of $new" standby_ok "$new" "$old"
  t_healthy=$(now_ms)
  echo "idem-fault n=$n kind=$kind old=$old new=$new recovery_ms=$((t_recovered - t0))" \
    "promoted_ms=$((t_promoted - t0)) healthy_ms=$((t_healthy - t0))"
}

if [ "${1:-}" = --fault ]; then
  fault "$2" "$3"
  exit 0
fi

IDEM=$1 MODE=$2 BASE=$3 FAILOVERS=$4 QUERY=${5:-}
shift $(($# < 5 ? $# : 5))
EXTRA=("$@")
case $MODE in
  sync) sync_mode=true ;;
  async) sync_mode=false ;;
  *) echo "chaos_failover.sh: the mode is sync or async, not '$MODE'" >&2; exit 2 ;;
esac
# Never skipped for want of a server: missing ones fail the run, named.
for tool in patroni etcd psql curl; do
  if ! command -v "$tool" >/dev/null; then
    echo "chaos_failover.sh: $tool is not installed: apt-get install patroni etcd-server python3-etcd postgresql curl (./run deps tests)" >&2
    exit 3
  fi
done
# Free ports: etcd BASE, BASE+1; PostgreSQL BASE+11, +12; Patroni's REST BASE+21, +22.
taken() { local p; for p in "$1" $(($1 + 1)) $(($1 + 11)) $(($1 + 12)) $(($1 + 21)) $(($1 + 22)); do
  ss -Htln "sport = :$p" | grep -q . && return 0; done; return 1; }
base=$BASE
for _ in $(seq 20); do taken "$base" || break; base=$((base + 30)); done
if taken "$base"; then echo "chaos_failover.sh: no free ports from $BASE" >&2; exit 3; fi
[ "$base" = "$BASE" ] || echo "chaos_failover.sh: ports from $BASE are in use: the cluster takes those from $base" >&2
STATE=$(mktemp -d "${TMPDIR:-/tmp}/idem-chaos-failover.XXXXXX")
chmod 755 "$STATE"
keep=0
cleanup() {
  bash "$HA" stop "$STATE/ha" >/dev/null 2>&1 || true
  if [ "$keep" = 0 ]; then rm -rf "$STATE"; else echo "chaos_failover.sh: files kept in $STATE" >&2; fi
}
trap cleanup EXIT
started=$(now_ms)
if ! url=$(SYNC_MODE=$sync_mode bash "$HA" start "$STATE/ha" "$base" 2>"$STATE/start.log"); then
  echo "chaos_failover.sh: could not start the Patroni cluster on 127.0.0.1:$base..$((base + 22)):" >&2
  cat "$STATE/start.log" >&2
  keep=1
  exit 3
fi
echo "chaos_failover.sh: $MODE cluster up in $(($(now_ms) - started)) ms: $url" >&2
[ -n "$QUERY" ] && url="$url&$QUERY"
# Defaults a caller's flags may replace (idem chaos refuses a flag twice).
has() { local a; for a in "${EXTRA[@]}"; do [ "$a" = "$1" ] && return 0; done; return 1; }
defaults=()
has --messages || defaults+=(--messages $((300 * (FAILOVERS + 1))))
has --kills || defaults+=(--kills $((20 + 2 * FAILOVERS)))
has --seed || defaults+=(--seed 1)
# A loss (the control) leaves messages that never apply: the drain gives up
# on them sooner (a failover in progress never counts as no progress).
has --drain-timeout || defaults+=(--drain-timeout 20s)
mkdir -p "$STATE/run"
rc=0
out=$("$IDEM" chaos --dir "$STATE/run" --store "$url" --provider-store "$url" --json \
  --fault-cmd "bash '$SELF' --fault '$STATE/ha' $MODE" --faults "$FAILOVERS" "${defaults[@]}" "${EXTRA[@]}") || rc=$?
# Each failover's own line (kind, nodes, recovery, promotion, healthy again), for the log.
for i in $(seq 0 $((FAILOVERS - 1))); do
  [ -f "$STATE/run/fault/$i.log" ] && grep -h "^idem-fault \|^chaos_failover.sh fault" "$STATE/run/fault/$i.log" >&2
done
echo "$out"
field() { echo "$out" | grep -o "\"$1\":-\?[0-9]*" | head -1 | cut -d: -f2; }
runs=$(field fault_runs)
failed=$(field fault_runs_failed)
summary="$runs failovers (p50 $(field fault_recovery_p50_ms) ms, p99 $(field fault_recovery_p99_ms) ms to the first effect on the new primary), lost $(field lost), duplicated $(field duplicated), acknowledged without effect $(field acked_not_committed)"
if [ "$MODE" = async ]; then
  if [ "$failed" = 0 ]; then
    echo "chaos_failover.sh: async control: $runs failovers, $(field acked_not_committed) acknowledged effects lost; $summary"
  else
    echo "chaos_failover.sh: async control: $failed of $runs failovers failed (see above); $summary"
  fi
  # The control's assertion: the run completed with its failovers and said what it lost.
  if [ -n "$runs" ] && [ "$runs" = "$FAILOVERS" ] && [ "$failed" = 0 ]; then rc=0; else rc=1; fi
else
  echo "chaos_failover.sh: sync: $summary"
fi
[ "$rc" = 0 ] || keep=1
exit "$rc"
