#!/usr/bin/env bash
# A throwaway RabbitMQ broker for the tests: its own epmd, its own node name,
# data, logs and config in a temporary directory, listening only on 127.0.0.1
# at unusual ports; everything stopped by PID (never a system-wide service).
#   test-rabbitmq.sh start STATE_DIR PORT   -> prints the URL; writes STATE_DIR/url and PIDs
#   test-rabbitmq.sh stop STATE_DIR         stops the broker and epmd, removes the data
#   test-rabbitmq.sh pause STATE_DIR        stops the broker only (data and epmd stay): a broker restart
#   test-rabbitmq.sh resume STATE_DIR       starts the broker again on the same data
# Ports: P (AMQP), P+1 (Erlang distribution), P+2 (epmd), where P is the
# first port from PORT on with the three free (scripts/test-ports.sh; said
# when it is not PORT), written into STATE_DIR/port and STATE_DIR/url.
# Shared: several test runs in one build directory (concurrent `ctest -R`)
# share one broker. Each start registers its caller (the parent PID, ctest)
# and each stop unregisters it; the broker stops when no live caller is
# left. All commands hold STATE_DIR.lock (flock) while they run.
# User "idem", password "secret", vhost "/". Starting takes ~6 s here.
# rabbitmq-server switches to its own user when started as root: when this
# script runs as root, the broker runs as user rabbitmq and its directory
# belongs to that user.
set -euo pipefail
RMQ_BIN=${RABBITMQ_BIN_DIR:-/usr/lib/rabbitmq/bin}
EPMD=${EPMD:-$(command -v epmd || true)}
source "$(dirname "$0")/test-ports.sh"

# Whether an AMQP 0-9-1 broker answers the protocol header on 127.0.0.1:$1
# with a method frame (connection.start).
answers_amqp() {
  (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'AMQP\x00\x00\x09\x01' >&3
    IFS= read -r -N 1 -t 3 b <&3 || exit 1
    [[ $b == $'\x01' ]]
  ) 2>/dev/null
}

# The prefix that runs a command as the broker's user.
RUNAS=()
if [ "$(id -u)" -eq 0 ]; then RUNAS=(setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups --); fi

start_broker() {
  local state=$1
  local base port
  base=$(cat "$state/base"); port=$(cat "$state/port")
  # The environment rabbitmq-server reads: everything in $base.
  (
    exec 9>&-  # the lock stays with this script, not with the broker
    export HOME=$base
    export RABBITMQ_NODENAME="idem-test-$port@localhost" RABBITMQ_USE_LONGNAME=false
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$((port + 1))
    export ERL_EPMD_PORT=$((port + 2)) ERL_EPMD_ADDRESS=127.0.0.1
    export RABBITMQ_MNESIA_BASE=$base/mnesia RABBITMQ_LOG_BASE=$base/log
    export RABBITMQ_CONFIG_FILE=$base/rabbitmq.conf RABBITMQ_ADVANCED_CONFIG_FILE=$base/advanced.config
    export RABBITMQ_ENABLED_PLUGINS_FILE=$base/enabled_plugins RABBITMQ_CONF_ENV_FILE=$base/rabbitmq-env.conf
    export RABBITMQ_PID_FILE=$base/broker.pid ERL_CRASH_DUMP=$base/erl_crash.dump
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    cd "$base"
    # In a session of its own (a test runner's signals to its process group
    # must not reach it), no inherited output pipes. The PID is the
    # rabbitmq-server script, which stops the VM on SIGTERM; the VM's own PID
    # is in $base/broker.pid.
    exec setsid "${RUNAS[@]}" "$RMQ_BIN/rabbitmq-server" </dev/null >>"$base/log/console.log" 2>&1
  ) &
  local pid=$!
  echo "$pid" >"$state/pid"
  local t0=$SECONDS
  for _ in $(seq 600); do
    answers_amqp "$port" && break
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "test-rabbitmq: rabbitmq-server exited at start:" >&2
      tail -n 40 "$base/log/console.log" >&2 2>/dev/null || true
      rm -f "$state/pid"; return 3
    fi
    sleep 0.1
  done
  if ! answers_amqp "$port"; then
    echo "test-rabbitmq: rabbitmq-server (pid $pid) does not answer AMQP on 127.0.0.1:$port" >&2
    return 3
  fi
  echo "test-rabbitmq: broker pid $pid on 127.0.0.1:$port, started in $((SECONDS - t0)) s, data in $base" >&2
}

# Stops the broker we started: SIGTERM to the script (a clean shutdown of the
# VM), then the VM itself by its PID if it outlives the script.
stop_broker() {
  local state=$1 base pid vm=""
  base=$(cat "$state/base" 2>/dev/null || true)
  [ -n "$base" ] && [ -f "$base/broker.pid" ] && vm=$(cat "$base/broker.pid" 2>/dev/null || true)
  if [ -f "$state/pid" ]; then
    pid=$(cat "$state/pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$state/pid"
  fi
  if [[ $vm =~ ^[0-9]+$ ]] && kill -0 "$vm" 2>/dev/null \
     && grep -q beam "/proc/$vm/cmdline" 2>/dev/null; then
    kill -TERM "$vm"
    for _ in $(seq 300); do kill -0 "$vm" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$vm" 2>/dev/null && kill -KILL "$vm"
  fi
  [ -n "$base" ] && rm -f "$base/broker.pid"
  return 0
}

lock() {
  mkdir -p "$(dirname "$1")"
  exec 9>"$1.lock"
  flock 9
}

# The registered callers that are still alive (one PID a line).
live_users() {
  local state=$1 p
  [ -f "$state/users" ] || return 0
  while read -r p; do
    [[ $p =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null && echo "$p"
  done <"$state/users"
  return 0
}

start() {
  local state=$1 port=$2
  [ -x "$RMQ_BIN/rabbitmq-server" ] \
    || { echo "test-rabbitmq: rabbitmq-server not found (apt-get install rabbitmq-server)" >&2; exit 3; }
  [ -n "$EPMD" ] || { echo "test-rabbitmq: epmd not found (apt-get install rabbitmq-server)" >&2; exit 3; }
  lock "$state"
  if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null && [ "$(cat "$state/first")" = "$port" ] \
     && answers_amqp "$(cat "$state/port")"; then
    { live_users "$state"; echo "$PPID"; } >"$state/users.new"; mv "$state/users.new" "$state/users"
    echo "test-rabbitmq: already running (pid $(cat "$state/pid")), shared with $(wc -l <"$state/users") caller(s)" >&2
    cat "$state/url"; return 0
  fi
  # Leftovers of a run that died without its stop: end them (by their PIDs).
  [ -d "$state" ] && stop_all "$state"
  local first=$port
  port=$(free_port "$port" 3) || exit 3
  say_port test-rabbitmq "$first" "$port"
  rm -rf "$state"; mkdir -p "$state"
  local base; base=$(mktemp -d "${TMPDIR:-/tmp}/idem-rabbitmq.XXXXXX")
  echo "$base" >"$state/base"; echo "$port" >"$state/port"; echo "$first" >"$state/first"
  mkdir -p "$base/mnesia" "$base/log"
  cat >"$base/rabbitmq.conf" <<EOF
loopback_users = none
default_user = idem
default_pass = secret
default_vhost = /
log.console = false
log.file.level = info
disk_free_limit.absolute = 10MB
EOF
  echo '[].' >"$base/enabled_plugins"
  echo '[].' >"$base/advanced.config"
  : >"$base/rabbitmq-env.conf"
  if [ "$(id -u)" -eq 0 ]; then chown -R rabbitmq:rabbitmq "$base"; fi

  # Our own epmd, on an unusual port, on 127.0.0.1 only.
  setsid "${RUNAS[@]}" "$EPMD" -port $((port + 2)) -address 127.0.0.1 \
    </dev/null >/dev/null 2>&1 9>&- &
  echo $! >"$state/epmd.pid"
  if ! start_broker "$state"; then
    # Keep the log of the failed start next to the state.
    cp "$(cat "$state/base")/log/"*.log "$state/" 2>/dev/null || true
    stop_all "$state"; exit 3
  fi
  echo "$PPID" >"$state/users"
  echo "amqp://idem:secret@127.0.0.1:$port/%2f" >"$state/url"
  cat "$state/url"
}

stop() {
  local state=$1
  [ -d "$state" ] || { echo "test-rabbitmq: not running" >&2; return 0; }
  lock "$state"
  local users; users=$(live_users "$state" | grep -vx "$PPID" || true)
  if [ -n "$users" ]; then
    echo "$users" >"$state/users"
    echo "test-rabbitmq: still used by PID(s) $(echo $users): left running" >&2
    return 0
  fi
  stop_all "$state"
}

# Stops the broker and epmd we started (by their PIDs) and removes the data.
stop_all() {
  local state=$1
  stop_broker "$state"
  if [ -f "$state/epmd.pid" ]; then
    local e; e=$(cat "$state/epmd.pid")
    if kill -0 "$e" 2>/dev/null; then
      kill -TERM "$e"
      for _ in $(seq 10); do kill -0 "$e" 2>/dev/null || break; sleep 0.1; done  # epmd ignores SIGTERM
      kill -0 "$e" 2>/dev/null && kill -KILL "$e"
    fi
    rm -f "$state/epmd.pid"
  fi
  local base; base=$(cat "$state/base" 2>/dev/null || true)
  case "$base" in */idem-rabbitmq.*) rm -rf "$base" ;; esac
  rm -f "$state/base" "$state/users"
  echo "test-rabbitmq: stopped" >&2
}

pause() {
  local state=$1
  lock "$state"
  [ -f "$state/pid" ] || { echo "test-rabbitmq: not running" >&2; exit 3; }
  stop_broker "$state"
  echo "test-rabbitmq: broker stopped (data kept)" >&2
}

resume() {
  local state=$1
  lock "$state"
  [ -f "$state/base" ] || { echo "test-rabbitmq: never started" >&2; exit 3; }
  if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then return 0; fi
  start_broker "$state" || exit 3
}

case "${1:-}" in
  start) start "$2" "$3" ;;
  stop) stop "$2" ;;
  pause) pause "$2" ;;
  resume) resume "$2" ;;
  *) echo "usage: $0 start STATE_DIR PORT | stop STATE_DIR | pause STATE_DIR | resume STATE_DIR" >&2; exit 2 ;;
esac
