#!/usr/bin/env bash
# idem chaos on a broker of its own, restarted during the run:
#   chaos_broker.sh IDEM redis|rabbitmq PORT SEED
# starts the broker here (scripts/test-<kind>.sh, 127.0.0.1:PORT, a temporary
# directory), runs idem chaos with --restart-cmd (pause + resume: the same
# data, the same port) twice spread over the kills, and stops the broker by
# its PID at the end. Prints idem chaos's JSON line.
set -euo pipefail
IDEM=$1 KIND=$2 PORT=$3 SEED=$4
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SCRIPT=$ROOT/scripts/test-$KIND.sh
STATE=$(mktemp -d "${TMPDIR:-/tmp}/idem-chaos-$KIND.XXXXXX")
trap 'bash "$SCRIPT" stop "$STATE" >/dev/null 2>&1 || true; rm -rf "$STATE" "$STATE.lock" "$STATE.start.log"' EXIT
if ! url=$(bash "$SCRIPT" start "$STATE" "$PORT" 2>"$STATE.start.log"); then
  echo "chaos_broker.sh: could not start $KIND on 127.0.0.1:$PORT:" >&2
  cat "$STATE.start.log" >&2
  exit 3
fi
case $KIND in
  redis) source="$url/0?stream=payments" ;;
  rabbitmq) source="$url?queue=payments" ;;
  *) echo "chaos_broker.sh: unknown kind $KIND" >&2; exit 2 ;;
esac
"$IDEM" chaos --source "$source" --messages 1500 --kills 60 --seed "$SEED" --restarts 2 \
  --restart-cmd "bash '$SCRIPT' pause '$STATE' >/dev/null 2>&1 && bash '$SCRIPT' resume '$STATE' >/dev/null 2>&1" --json
