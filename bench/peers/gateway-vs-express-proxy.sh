#!/usr/bin/env bash
# idem gateway beside the proxy a user could build from npm instead
# (bench/peers/express-proxy/server.js: express + express-idempotency with
# its records in Redis, in front of http-proxy-middleware), in one run, with
# the same upstream and the same clients (`idem chaos gateway`, which runs
# either: the upstream in its process counts executions per key):
#   1. chaos: GATEWAYS processes of each (idem gateway on one PostgreSQL;
#      the peer's on one Redis) SIGKILLed KILLS times and restarted (idem
#      also at its kill points), answers lost between client and proxy,
#      upstream answers late now and then, a key's first request sent twice
#      at once now and then: duplicate upstream executions counted for both;
#   2. throughput: no faults, KEYS_T keys once each plus one repeat, one
#      process of each, ROUNDS rounds alternating: keys/s and the ratio
#      idem/peer per round, and the medians.
# PostgreSQL and Redis are throwaway servers of this script
# (scripts/test-postgres.sh, fsync on; scripts/test-redis.sh, AOF every
# second). The npm packages are pinned (test/http/gateway_clients/npm-packages.sh).
#   bench/peers/gateway-vs-express-proxy.sh            # the raw log: bench/results/gateway-vs-express-proxy-DATE.log
#   KEYS=200 KILLS=5 KEYS_T=500 ROUNDS=1 bench/peers/gateway-vs-express-proxy.sh   # smoke
#   SUMMARY_OF=LOG bench/peers/gateway-vs-express-proxy.sh   # the summary of a log again
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
[ -x "$IDEM" ] || { echo "build idem first (./run build): $IDEM" >&2; exit 2; }
GATEWAYS=${GATEWAYS:-3}
KEYS=${KEYS:-1000}
KILLS=${KILLS:-20}
KEYS_T=${KEYS_T:-4000}
CLIENTS=${CLIENTS:-16}
ROUNDS=${ROUNDS:-5}
SEED=${SEED:-1}
LOG=${LOG:-$ROOT/bench/results/gateway-vs-express-proxy-$(date -u +%Y-%m-%d).log}
# The summary of a log (stdout): duplicates of each, the keys/s of each
# round and their ratio, the medians.
field() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" <<<"$1"; }
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
summary() {  # summary LOG
  local side l i a b ratios=()
  echo "== summary"
  for side in idem-gateway peer; do
    l=$(grep "^run=$side " "$1")
    echo "$side: keys=$(field "$l" keys) kills=$(field "$l" kills) responses_lost=$(field "$l" responses_lost) upstream_timeouts=$(field "$l" upstream_timeouts) executions=$(field "$l" executions) duplicated_keys=$(field "$l" duplicated_keys) duplicate_executions=$(field "$l" duplicate_executions) of_them_sent_twice_at_once=$(field "$l" duplicated_twinned_keys) replay_mismatches=$(field "$l" replay_mismatches) outcome_unknown=$(field "$l" outcome_unknown) unresolved=$(field "$l" unresolved) ok=$(field "$l" ok)"
  done
  for i in $(grep -o '^run=idem-gateway-throughput-[0-9]*' "$1" | sed 's/.*-//'); do
    a=$(field "$(grep "^run=idem-gateway-throughput-$i " "$1")" keys_per_s)
    b=$(field "$(grep "^run=peer-throughput-$i " "$1")" keys_per_s)
    ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')")
    echo "throughput round $i (keys/s, each key sent and repeated once): idem-gateway $a, peer $b, ratio ${ratios[-1]}x"
  done
  a=$(grep '^run=idem-gateway-throughput' "$1" | sed -n 's/.*"keys_per_s":\([0-9.]*\).*/\1/p' | median)
  b=$(grep '^run=peer-throughput' "$1" | sed -n 's/.*"keys_per_s":\([0-9.]*\).*/\1/p' | median)
  echo "throughput medians: idem-gateway $a keys/s, peer $b keys/s; median of the rounds' ratios idem/peer $(printf '%s\n' "${ratios[@]}" | median)x"
}
if [ -n "${SUMMARY_OF:-}" ]; then summary "$SUMMARY_OF"; exit 0; fi
NPM_DIR=$("$ROOT/test/http/gateway_clients/npm-packages.sh")
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-gw-peer.XXXXXX")
cleanup() {
  "$ROOT/scripts/test-redis.sh" stop "$work/redis" >/dev/null 2>&1 || true
  "$ROOT/scripts/test-postgres.sh" stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
PG=$("$ROOT/scripts/test-postgres.sh" start "$work/pg" 25740)
REDIS=$("$ROOT/scripts/test-redis.sh" start "$work/redis" 26740)
mkdir -p "$(dirname "$LOG")"
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }
say "# bench/peers/gateway-vs-express-proxy.sh $(date -u +%FT%TZ) $(nproc) cores, idem $("$IDEM" --version)"
say "# GATEWAYS=$GATEWAYS KEYS=$KEYS KILLS=$KILLS KEYS_T=$KEYS_T CLIENTS=$CLIENTS ROUNDS=$ROUNDS SEED=$SEED"
say "# peer: $(cd "$NPM_DIR" && node -e 'for (const p of ["express","express-idempotency","express-idempotency-redis-adapter","http-proxy-middleware"]) process.stdout.write(p + "@" + require("./node_modules/" + p + "/package.json").version + " ")')"

PEER_NAME=express-idempotency+http-proxy-middleware
# The peer's processes: node in place of the shell (the run kills that PID).
export NODE_PATH=$NPM_DIR/node_modules
PEER_CMD="exec node $ROOT/bench/peers/express-proxy/server.js"
flush_redis() { redis-cli -u "$REDIS" flushall >/dev/null; }
# run NAME ARGS...: one idem chaos gateway run; its JSON line to the log.
run() {
  local name=$1 line
  shift
  line=$("$IDEM" chaos gateway --seed "$SEED" --json "$@" 2>>"$work/progress.log" | tail -1) || true
  [[ $line == \{* ]] || { echo "no result from $name: $(tail -5 "$work/progress.log")" >&2; exit 3; }
  say "run=$name $line"
}

say "== chaos: $GATEWAYS processes each, $KILLS kills, answers lost, late upstream answers, twin requests"
run idem-gateway --store "$PG" --gateways "$GATEWAYS" --keys "$KEYS" --kills "$KILLS" --clients 8
flush_redis
REDIS_URL=$REDIS/1 run peer --peer-cmd "$PEER_CMD" --peer-name "$PEER_NAME" --gateways "$GATEWAYS" --keys "$KEYS" \
  --kills "$KILLS" --clients 8 --key-timeout 5s

say "== throughput: no faults, 1 process each, $KEYS_T keys + 1 repeat each, $CLIENTS clients"
quiet=(--kills 0 --lost-response-rate 0 --upstream-lost-rate 0 --twin-rate 0 --repeats 1 --gateways 1
       --keys "$KEYS_T" --clients "$CLIENTS")
for i in $(seq "$ROUNDS"); do
  run "idem-gateway-throughput-$i" --store "$PG" "${quiet[@]}"
  flush_redis
  REDIS_URL=$REDIS/1 run "peer-throughput-$i" --peer-cmd "$PEER_CMD" --peer-name "$PEER_NAME" "${quiet[@]}"
done

summary "$LOG" | tee -a "$LOG"
