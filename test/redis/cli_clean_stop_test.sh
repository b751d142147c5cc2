#!/usr/bin/env bash
# idem run on Redis Streams ends with a clean stop: its consumer name leaves
# the group when nothing is pending under it (StreamSource::Close).
# usage: cli_clean_stop_test.sh IDEM_BINARY REDIS_URL
set -uo pipefail
IDEM=$1
URL=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
STREAM="idem-cli-stop-$$-$RANDOM"
SRC="$URL/6?stream=$STREAM&group=billing"
fail() { echo "FAIL: $*"; exit 1; }
# Every message twice (a producer retry).
"$IDEM" publish --source "$SRC" --messages 20 --dup-rate 1 >"$T/pub" 2>&1 || { cat "$T/pub"; fail "publish"; }
"$IDEM" run --source "$SRC" --store "sqlite:$T/s.db" --consumer payments --drain --json >"$T/run" 2>"$T/err" \
  || { cat "$T/run" "$T/err"; fail "run"; }
grep -q '"applied":20,"duplicates":20' "$T/run" || { cat "$T/run"; fail "not 20 applied and 20 duplicates"; }
consumers=$(redis-cli -u "$URL/6" XINFO CONSUMERS "$STREAM" billing 2>&1)
redis-cli -u "$URL/6" DEL "$STREAM" >/dev/null
[ -z "$consumers" ] || fail "consumers left in the group after a clean stop: $consumers"
echo "ok: no consumer left behind"
