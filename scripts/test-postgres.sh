#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for the tests: initdb in a temporary
# directory, listening only on 127.0.0.1 at an unusual port, fsync on; stopped
# by the postmaster's PID.
#   test-postgres.sh start STATE_DIR PORT   -> prints the URL; writes STATE_DIR/url, STATE_DIR/pid
#   test-postgres.sh stop STATE_DIR
#   test-postgres.sh pause|resume STATE_DIR   (stop and start again, data kept)
#   test-postgres.sh standby STATE_DIR PRIMARY_STATE_DIR PORT
#                                 -> a streaming standby of that server (pg_basebackup -R), its URL
# PORT is the first port tried: the server takes the first free one from
# there on (scripts/test-ports.sh), says so when it is not PORT, and writes
# it into STATE_DIR/port and STATE_DIR/url.
# Roles: "postgres" (trust) and "idem_pw" (password "secret", scram), for the
# wrong-password test. Databases: idem_test.
set -euo pipefail
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
RUN_USER=${PG_RUN_USER:-postgres}   # postgres refuses to run as root

source "$(dirname "$0")/test-ports.sh"

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u "$RUN_USER" -- "$@"; else "$@"; fi; }

start() {
  local state=$1 port=$2
  [ -x "$PG_BIN/initdb" ] || { echo "test-postgres: no initdb under $PG_BIN (apt-get install postgresql)" >&2; exit 3; }
  if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then
    echo "test-postgres: already running (pid $(cat "$state/pid"))" >&2
    cat "$state/url"; return 0
  fi
  rm -rf "$state"; mkdir -p "$state"
  local base; base=$(mktemp -d "${TMPDIR:-/tmp}/idem-pg.XXXXXX")
  chmod 755 "$base"; mkdir -p "$base/data" "$base/sock"
  [ "$(id -u)" = 0 ] && chown "$RUN_USER" "$base/data" "$base/sock"
  echo "$base" >"$state/base"
  as_pg "$PG_BIN/initdb" -D "$base/data" -U postgres --auth=trust -E UTF8 --locale=C >"$state/initdb.log" 2>&1 \
    || { cat "$state/initdb.log" >&2; exit 3; }
  cat >>"$base/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$base/sock'
fsync = on
synchronous_commit = on
max_connections = 300
password_encryption = scram-sha-256
CONF
  cat >"$base/data/pg_hba.conf" <<HBA
local all all trust
host all idem_pw 127.0.0.1/32 scram-sha-256
host all all 127.0.0.1/32 trust
host replication postgres 127.0.0.1/32 trust
HBA
  port=$(listen_on_free_port "$state" "$base" "$port")
  "$PG_BIN/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qAt -v ON_ERROR_STOP=1 \
    -c "CREATE DATABASE idem_test" -c "CREATE ROLE idem_pw LOGIN PASSWORD 'secret' SUPERUSER" >/dev/null
  echo "postgres://postgres@127.0.0.1:$port/idem_test" >"$state/url"
  echo "test-postgres: pid $(cat "$state/pid") on 127.0.0.1:$port, data in $base" >&2
  cat "$state/url"
}

standby() {
  local state=$1 primary=$2 port=$3
  local primary_port; primary_port=$(sed -E 's|.*:([0-9]+)/.*|\1|' "$primary/url")
  rm -rf "$state"; mkdir -p "$state"
  local base; base=$(mktemp -d "${TMPDIR:-/tmp}/idem-pg.XXXXXX")
  chmod 755 "$base"; mkdir -p "$base/sock"
  [ "$(id -u)" = 0 ] && chown "$RUN_USER" "$base" "$base/sock"
  echo "$base" >"$state/base"
  as_pg "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres -D "$base/data" -R -X stream --checkpoint=fast \
    >"$state/basebackup.log" 2>&1 || { cat "$state/basebackup.log" >&2; exit 3; }
  cat >>"$base/data/postgresql.conf" <<CONF
unix_socket_directories = '$base/sock'
CONF
  port=$(listen_on_free_port "$state" "$base" "$port")
  echo "postgres://postgres@127.0.0.1:$port/idem_test" >"$state/url"
  echo "test-postgres: standby pid $(cat "$state/pid") on 127.0.0.1:$port, data in $base" >&2
  cat "$state/url"
}

# listen_on_free_port STATE_DIR BASE FIRST: starts the server of BASE/data
# on the first free port from FIRST on (the next free one if another start
# took it meanwhile); writes STATE_DIR/pid and STATE_DIR/port; prints the port.
listen_on_free_port() {
  local state=$1 base=$2 first=$3 port=$3 attempt
  for attempt in 1 2 3 4 5; do
    port=$(free_port "$port") || exit 3
    echo "port = $port" >>"$base/data/postgresql.conf"  # the last setting wins
    if as_pg "$PG_BIN/pg_ctl" -D "$base/data" -l "$base/sock/server.log" -w -t 60 start >/dev/null; then
      head -1 "$base/data/postmaster.pid" >"$state/pid"
      echo "$port" >"$state/port"
      say_port test-postgres "$first" "$port"
      echo "$port"
      return 0
    fi
    port_free "$port" && { cat "$base/sock/server.log" >&2; exit 3; }
    port=$((port + 1))
  done
  cat "$base/sock/server.log" >&2
  exit 3
}

stop() {
  local state=$1
  [ -f "$state/pid" ] || { echo "test-postgres: not running" >&2; return 0; }
  local pid; pid=$(cat "$state/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -INT "$pid"   # fast shutdown, sent to the postmaster we started
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  local base; base=$(cat "$state/base" 2>/dev/null || true)
  case "$base" in */idem-pg.*) rm -rf "$base" ;; esac
  rm -f "$state/pid"
  echo "test-postgres: stopped" >&2
}

# Stops the server but keeps its data (a server restart, for recovery tests).
pause() {
  local state=$1 base; base=$(cat "$state/base")
  as_pg "$PG_BIN/pg_ctl" -D "$base/data" -m fast -w -t 60 stop >/dev/null
  rm -f "$state/pid"
}
resume() {
  local state=$1 base; base=$(cat "$state/base")
  as_pg "$PG_BIN/pg_ctl" -D "$base/data" -l "$base/sock/server.log" -w -t 60 start >/dev/null
  head -1 "$base/data/postmaster.pid" >"$state/pid"
}

case "${1:-}" in
  start) start "$2" "$3" ;;
  stop) stop "$2" ;;
  pause) pause "$2" ;;
  resume) resume "$2" ;;
  standby) standby "$2" "$3" "$4" ;;
  *) echo "usage: $0 start STATE_DIR PORT | stop STATE_DIR | pause STATE_DIR | resume STATE_DIR |" \
       "standby STATE_DIR PRIMARY_STATE_DIR PORT" >&2; exit 2 ;;
esac
