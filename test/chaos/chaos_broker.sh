#!/usr/bin/env bash
# idem chaos on a broker of its own, restarted during the run:
#   chaos_broker.sh IDEM redis|rabbitmq PORT SEED [two-stage]
# (two-stage: the pipeline's stage 1 on the embedded queue, its relays
# publishing to the broker, stage 2 consuming from it) starts the broker here (scripts/test-<kind>.sh, 127.0.0.1:PORT, a temporary
# directory), runs idem chaos with --restart-cmd (pause + resume: the same
# data, the same port) twice spread over the kills, and stops the broker by
# its PID at the end. Prints idem chaos's JSON line.
set -euo pipefail
IDEM=$1 KIND=$2 PORT=$3 SEED=$4 MODE=${5:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SCRIPT=$ROOT/scripts/test-$KIND.sh
STATE=$(mktemp -d "${TMPDIR:-/tmp}/idem-chaos-$KIND.XXXXXX")
trap 'bash "$SCRIPT" stop "$STATE" >/dev/null 2>&1 || true; rm -rf "$STATE" "$STATE.lock" "$STATE.start.log"' EXIT
if ! url=$(bash "$SCRIPT" start "$STATE" "$PORT" 2>"$STATE.start.log"); then
  echo "chaos_broker.sh: could not start $KIND on 127.0.0.1:$PORT:" >&2
  cat "$STATE.start.log" >&2
  exit 3
fi
# The port it took: the first free one from PORT on (scripts/test-ports.sh).
echo "chaos_broker.sh: $KIND at ${url#*@}" >&2
case $KIND in
  redis) source="$url/0?stream=payments" shipping="$url/0?stream=shipping" ;;
  rabbitmq) source="$url?queue=payments" shipping="$url?queue=shipping" ;;
  *) echo "chaos_broker.sh: unknown kind $KIND" >&2; exit 2 ;;
esac
restart=(--restarts 2 --restart-cmd "bash '$SCRIPT' pause '$STATE' >/dev/null 2>&1 && bash '$SCRIPT' resume '$STATE' >/dev/null 2>&1")
if [ "$MODE" = two-stage ]; then
  "$IDEM" chaos --pipeline two-stage --source2 "$shipping" --messages 400 --kills 30 --consumers 2 --relays 2 \
    --keys 20 --seed "$SEED" "${restart[@]}" --json
else
  "$IDEM" chaos --source "$source" --messages 2000 --kills 60 --seed "$SEED" "${restart[@]}" --json
fi
