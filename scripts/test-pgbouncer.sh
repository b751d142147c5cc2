#!/usr/bin/env bash
# A throwaway pgbouncer in transaction mode in front of the test PostgreSQL
# (scripts/test-postgres.sh): listening only on 127.0.0.1 at the given port,
# every database of the server reachable by name, trust auth; stopped by its
# PID. pgbouncer refuses to run as root: it runs as "postgres".
#   test-pgbouncer.sh start STATE_DIR PORT PG_STATE_DIR  -> prints a URL; writes STATE_DIR/url, STATE_DIR/pid
# PORT is the first port tried (the first free one from there on is taken,
# scripts/test-ports.sh); the server's port is read from PG_STATE_DIR/port
# (scripts/test-postgres.sh).
#   test-pgbouncer.sh stop STATE_DIR
set -euo pipefail
RUN_USER=${PG_RUN_USER:-postgres}
source "$(dirname "$0")/test-ports.sh"
as_run_user() { if [ "$(id -u)" = 0 ]; then runuser -u "$RUN_USER" -- "$@"; else "$@"; fi; }

start() {
  local state=$1 port=$2 pg_port first=$2
  pg_port=$(cat "$3/port") || { echo "test-pgbouncer: no PostgreSQL started in $3" >&2; exit 3; }
  command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] ||
    { echo "test-pgbouncer: no pgbouncer (apt-get install pgbouncer)" >&2; exit 3; }
  local bin; bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
  if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then
    echo "test-pgbouncer: already running (pid $(cat "$state/pid"))" >&2
    cat "$state/url"; return 0
  fi
  port=$(free_port "$port") || exit 3
  say_port test-pgbouncer "$first" "$port"
  rm -rf "$state"; mkdir -p "$state"
  printf '"postgres" ""\n' >"$state/users.txt"
  cat >"$state/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$pg_port
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_user = postgres
auth_file = $state/users.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = 8
max_client_conn = 500
server_idle_timeout = 10
ignore_startup_parameters = extra_float_digits
logfile = $state/pgbouncer.log
pidfile = $state/pgbouncer.pid
INI
  [ "$(id -u)" = 0 ] && chown -R "$RUN_USER" "$state"
  as_run_user "$bin" -d "$state/pgbouncer.ini" >"$state/start.log" 2>&1 || { cat "$state/start.log" >&2; exit 3; }
  for _ in $(seq 100); do
    [ -s "$state/pgbouncer.pid" ] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.05
  done
  [ -s "$state/pgbouncer.pid" ] || { echo "test-pgbouncer: did not start" >&2; cat "$state/pgbouncer.log" >&2 || true; exit 3; }
  cp "$state/pgbouncer.pid" "$state/pid"
  echo "$port" >"$state/port"
  echo "postgres://postgres@127.0.0.1:$port/idem_test" >"$state/url"
  echo "test-pgbouncer: pid $(cat "$state/pid") on 127.0.0.1:$port, in front of 127.0.0.1:$pg_port" >&2
  cat "$state/url"
}

stop() {
  local state=$1
  [ -f "$state/pid" ] || { echo "test-pgbouncer: not running" >&2; return 0; }
  local pid; pid=$(cat "$state/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -INT "$pid"   # safe shutdown, sent to the pgbouncer we started
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$state/pid"
  echo "test-pgbouncer: stopped" >&2
}

case "${1:-}" in
  start) start "$2" "$3" "$4" ;;
  stop) stop "$2" ;;
  *) echo "usage: test-pgbouncer.sh start STATE_DIR PORT PG_STATE_DIR | stop STATE_DIR" >&2; exit 2 ;;
esac
