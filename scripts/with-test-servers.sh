#!/usr/bin/env bash
# Runs a command on the servers the CTest fixtures started, whose ports are
# chosen when they start (scripts/test-ports.sh):
#   with-test-servers.sh BUILD_DIR COMMAND [ARG...]
# In every argument, {pg}, {pgbouncer}, {redis}, {rabbitmq}, {sqs}, {pubsub} and
# {dynamodb} become that server's URL, as its start wrote it into
# BUILD_DIR/<server>-test/url (postgres://postgres@127.0.0.1:PORT/DB, see below,
# redis://127.0.0.1:PORT, amqp://idem:secret@127.0.0.1:PORT/%2f,
# http://127.0.0.1:PORT for sqs, pubsub and dynamodb), and {run} a name no other run
# uses (for a queue or a stream on a server that concurrent runs share). A
# server that is not running is an error (exit 3), never a skip.
# {pg} and {pgbouncer} lead to a database of this run's own, created on the
# server (the same one through both), so that commands running at once never
# share tables: two tests' relays would drain one outbox.
set -euo pipefail
build=$1
shift
run="run-$$-$(date +%s%N)-$RANDOM"
db=""
own_database() {
  [ -n "$db" ] && return 0
  local admin
  admin=$(cat "$build/pg-test/url" 2>/dev/null) ||
    { echo "with-test-servers: no pg server started in $build/pg-test (run the tests with ctest)" >&2; exit 3; }
  db="t_${run//-/_}"
  psql "${admin%/*}/postgres" -qAt -v ON_ERROR_STOP=1 -c "CREATE DATABASE $db" >/dev/null ||
    { echo "with-test-servers: cannot create the database $db on ${admin%/*}" >&2; exit 3; }
}
args=()
for a in "$@"; do
  a=${a//"{run}"/$run}
  for server in pg pgbouncer redis rabbitmq sqs pubsub dynamodb; do
    [[ $a == *"{$server}"* ]] || continue
    url=$(cat "$build/$server-test/url" 2>/dev/null) && [ -f "$build/$server-test/pid" ] ||
      { echo "with-test-servers: no $server server started in $build/$server-test (run the tests with ctest)" >&2; exit 3; }
    if [ "$server" = pg ] || [ "$server" = pgbouncer ]; then
      own_database
      url="${url%/*}/$db"
    fi
    a=${a//"{$server}"/$url}
  done
  args+=("$a")
done
exec "${args[@]}"
