#!/usr/bin/env bash
# A throwaway 2-node Patroni cluster (+ one etcd) on 127.0.0.1, run as postgres,
# stopped by PID. For the high-availability tests of issue 34: the chaos runs
# across failovers (test/chaos/chaos_failover.sh) start it. SYNC_MODE=false
# in the environment of `start`: asynchronous replication (their control).
#   test-patroni.sh start DIR BASEPORT   -> prints a multi-host URL; DIR/{etcd,n1,n2}
#   test-patroni.sh primary DIR          -> the primary's node name (n1|n2), via Patroni's REST API
#   test-patroni.sh kill-postmaster DIR NODE | kill-patroni DIR NODE | restart-patroni DIR NODE
#   test-patroni.sh stop DIR
# Ports: etcd client BASE, peer BASE+1; node i: PostgreSQL BASE+10+i, REST BASE+20+i.
set -euo pipefail
RUN_USER=${PG_RUN_USER:-postgres}
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u "$RUN_USER" -- "$@"; else "$@"; fi; }
# Starts "$@" in its own session as postgres, its PID (not runuser's) in $pidfile.
# Nothing holds the caller's stdout (url=$(test-patroni.sh start ...) returns).
spawn() { local pidfile=$1 log=$2; shift 2
  : >>"$log"; [ "$(id -u)" = 0 ] && chown "$RUN_USER" "$log"
  as_pg setsid sh -c 'echo $$ >"$0"; log=$1; shift; exec "$@" >>"$log" 2>&1' "$pidfile" "$log" "$@" </dev/null >>"$log" 2>&1 &
  for _ in $(seq 50); do [ -s "$pidfile" ] && return 0; sleep 0.1; done; echo "ha: $pidfile not written" >&2; exit 3; }
node_conf() { local dir=$1 base=$2 i=$3
  cat >"$dir/n$i/patroni.yml" <<YML
scope: idem_ha
namespace: /idem/
name: n$i
log: {level: INFO}
restapi:
  listen: 127.0.0.1:$((base + 20 + i))
  connect_address: 127.0.0.1:$((base + 20 + i))
etcd3:
  hosts: 127.0.0.1:$base
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    primary_start_timeout: 0      # a crashed primary fails over, not restarts in place
    synchronous_mode: ${SYNC_MODE:-true}
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: 'on'
        synchronous_commit: 'on'
        fsync: 'on'
        max_connections: 100
        wal_keep_size: 128MB
  initdb: [{encoding: UTF8}, {locale: C}, {auth: trust}]
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$((base + 10 + i))
  connect_address: 127.0.0.1:$((base + 10 + i))
  data_dir: $dir/n$i/data
  bin_dir: $PG_BIN
  pgpass: $dir/n$i/pgpass
  authentication:
    superuser: {username: postgres}
    replication: {username: postgres}
    rewind: {username: postgres}
  parameters:
    unix_socket_directories: '$dir/n$i'
YML
}
start() { local dir=$1 base=$2
  rm -rf "$dir"; mkdir -p "$dir/etcd" "$dir/n1" "$dir/n2"; chmod 755 "$dir"
  [ "$(id -u)" = 0 ] && chown -R "$RUN_USER" "$dir"
  echo "$base" >"$dir/baseport"
  spawn "$dir/etcd.pid" "$dir/etcd.log" etcd --name e1 --data-dir "$dir/etcd/data" \
    --listen-client-urls "http://127.0.0.1:$base" --advertise-client-urls "http://127.0.0.1:$base" \
    --listen-peer-urls "http://127.0.0.1:$((base + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((base + 1))" \
    --initial-cluster "e1=http://127.0.0.1:$((base + 1))" --initial-cluster-state new
  for i in 1 2; do node_conf "$dir" "$base" $i; [ "$(id -u)" = 0 ] && chown -R "$RUN_USER" "$dir/n$i"; done
  spawn "$dir/n1/patroni.pid" "$dir/n1/patroni.log" patroni "$dir/n1/patroni.yml"
  wait_primary "$dir" 60 >/dev/null
  spawn "$dir/n2/patroni.pid" "$dir/n2/patroni.log" patroni "$dir/n2/patroni.yml"
  # Healthy: a primary and a synchronous standby (GET /sync answers 200 on it).
  for _ in $(seq 600); do
    curl -fs "http://127.0.0.1:$((base + 22))/sync" >/dev/null 2>&1 && break
    curl -fs "http://127.0.0.1:$((base + 21))/sync" >/dev/null 2>&1 && break
    [ "${SYNC_MODE:-true}" = false ] && curl -fs "http://127.0.0.1:$((base + 22))/replica" >/dev/null 2>&1 && break
    sleep 0.1; done
  echo "postgres://postgres@127.0.0.1:$((base + 11)),127.0.0.1:$((base + 12))/postgres?target_session_attrs=read-write"
}
wait_primary() { local dir=$1 secs=$2 base; base=$(cat "$dir/baseport")
  for _ in $(seq $((secs * 10))); do
    for i in 1 2; do curl -fs "http://127.0.0.1:$((base + 20 + i))/primary" >/dev/null 2>&1 && { echo "n$i"; return 0; }; done
    sleep 0.1; done
  echo "ha: no primary after ${secs}s" >&2; return 3; }
postmaster_pid() { head -1 "$1/$2/data/postmaster.pid"; }
stop() { local dir=$1
  for i in 1 2; do [ -f "$dir/n$i/patroni.pid" ] && kill -TERM "$(cat "$dir/n$i/patroni.pid")" 2>/dev/null || true; done
  for i in 1 2; do local p; p=$(cat "$dir/n$i/patroni.pid" 2>/dev/null || echo 0)
    for _ in $(seq 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done; done
  # A postmaster left behind (its Patroni was SIGKILLed): immediate shutdown, by its PID.
  for i in 1 2; do if [ -f "$dir/n$i/data/postmaster.pid" ]; then local pm; pm=$(postmaster_pid "$dir" "n$i")
    kill -0 "$pm" 2>/dev/null && kill -QUIT "$pm" || true; fi; done
  [ -f "$dir/etcd.pid" ] && kill -TERM "$(cat "$dir/etcd.pid")" 2>/dev/null || true
  sleep 0.5; }
case "${1:-}" in
  start) start "$2" "$3" ;;
  primary) wait_primary "$2" "${3:-30}" ;;
  kill-postmaster) kill -KILL "$(postmaster_pid "$2" "$3")" ;;
  kill-patroni) kill -KILL "$(cat "$2/$3/patroni.pid")" ;;
  restart-patroni) spawn "$2/$3/patroni.pid" "$2/$3/patroni.log" patroni "$2/$3/patroni.yml" ;;
  stop) stop "$2" ;;
  *) echo "usage: ha.sh start DIR BASEPORT | primary DIR | kill-postmaster DIR NODE | kill-patroni DIR NODE | restart-patroni DIR NODE | stop DIR" >&2; exit 2 ;;
esac
