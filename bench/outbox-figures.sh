#!/usr/bin/env bash
# The outbox's figures (doc/performance.md, "Outbox"):
#   1. idem bench outbox-add: the work of a handler vs the same work plus one
#      Outbox::Add per message, per message and in batches of 100, on SQLite
#      (synchronous FULL) and PostgreSQL (fsync on)       -> outbox-add.log
#   2. idem bench relay: relay throughput SQLite -> embedded queue, PostgreSQL -> embedded queue,
#      PostgreSQL -> RabbitMQ (durable queue), PostgreSQL -> Kafka's mock
#      cluster                                               -> outbox-relay.log
#      then each path's latency commit -> receipt at half its measured rate,
#      LATENCY_RUNS times (3)                                -> outbox-latency.log
#   3. Publish in turn vs PublishBatch on RabbitMQ, classic and quorum queues
#                                                            -> outbox-publish-batch.log
# and a plot of the relay's rates (bench/results/outbox-relay.png) when
# gnuplot is installed. Throwaway servers on 127.0.0.1, stopped by PID.
#   bench/outbox-figures.sh                  # MESSAGES=50000 KEYS=100 PAYLOAD=100
#   MESSAGES=5000 SECONDS_PER_ROUND=0.5 bench/outbox-figures.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
PUBLISH_BATCH=${PUBLISH_BATCH:-$ROOT/build/bench/idem_publish_batch_bench}
[ -x "$IDEM" ] || { echo "build idem first (./run build): $IDEM" >&2; exit 2; }
MESSAGES=${MESSAGES:-50000}
KEYS=${KEYS:-100}
PAYLOAD=${PAYLOAD:-100}
SECONDS_PER_ROUND=${SECONDS_PER_ROUND:-2}
LATENCY_SECONDS=${LATENCY_SECONDS:-10}
LATENCY_RUNS=${LATENCY_RUNS:-3}
OUT=${OUT:-$ROOT/bench/results}
PG_PORT=${PG_PORT:-55491}
AMQP_PORT=${AMQP_PORT:-56751}
mkdir -p "$OUT"
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-outbox-figures.XXXXXX")
chmod 755 "$work"
cleanup() {
  "$ROOT/scripts/test-rabbitmq.sh" stop "$work/rmq" >/dev/null 2>&1 || true
  "$ROOT/scripts/test-postgres.sh" stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
pg=$("$ROOT/scripts/test-postgres.sh" start "$work/pg" "$PG_PORT")
amqp=$("$ROOT/scripts/test-rabbitmq.sh" start "$work/rmq" "$AMQP_PORT")
# The logs name the temporary directory $TMP.
clean() { sed "s|$work|\$TMP|g"; }

echo "== outbox-add" >&2
: >"$OUT/outbox-add.log"
for store in "sqlite:$work/add.db" "$pg"; do
  for batch in 100 1; do
    echo "\$ idem bench outbox-add --store $store --batch $batch --seconds $SECONDS_PER_ROUND" | clean >>"$OUT/outbox-add.log"
    "$IDEM" bench outbox-add --store "$store" --batch "$batch" --seconds "$SECONDS_PER_ROUND" 2>/dev/null |
      clean | tee -a "$OUT/outbox-add.log"
  done
done

echo "== relay" >&2
: >"$OUT/outbox-relay.log"
: >"$OUT/outbox-latency.log"
paths=("sqlite:$work/relay.db|embedded:$work/q.db" "$pg|embedded:$work/pgq.db" "$pg|$amqp" "$pg|kafka-mock:")
for path in "${paths[@]}"; do
  store=${path%%|*} to=${path#*|}
  args=(--store "$store" --to "$to" --keys "$KEYS" --payload-bytes "$PAYLOAD")
  echo "\$ idem bench relay ${args[*]} --messages $MESSAGES" | clean >>"$OUT/outbox-relay.log"
  line=$("$IDEM" bench relay "${args[@]}" --messages "$MESSAGES" 2>/dev/null | clean)
  echo "$line" | tee -a "$OUT/outbox-relay.log"
  max=$(echo "$line" | sed -n 's/.* messages_per_s=\([0-9]*\).*/\1/p')
  rate=$((max / 2))
  n=$((rate * LATENCY_SECONDS))
  for run in $(seq "$LATENCY_RUNS"); do
    echo "\$ idem bench relay ${args[*]} --messages $n --rate $rate   # run $run" | clean >>"$OUT/outbox-latency.log"
    "$IDEM" bench relay "${args[@]}" --messages "$n" --rate "$rate" 2>/dev/null | clean | tee -a "$OUT/outbox-latency.log"
  done
done

if [ -x "$PUBLISH_BATCH" ]; then
  echo "== publish vs PublishBatch (RabbitMQ)" >&2
  : >"$OUT/outbox-publish-batch.log"
  for q in "queue=bench-classic" "queue=bench-quorum&queue_type=quorum"; do
    echo "\$ idem_publish_batch_bench \"\$AMQP?$q\" 20000 100" >>"$OUT/outbox-publish-batch.log"
    "$PUBLISH_BATCH" "$amqp?$q" 20000 100 | tee -a "$OUT/outbox-publish-batch.log"
  done
fi

plot_relay() {
  grep '^peer=idem-relay' "$OUT/outbox-relay.log" |
    sed -n 's/.*store=\([^ ]*\) to=\([^ ]*\) .* messages_per_s=\([0-9.]*\).* relayed_per_s=\([0-9.]*\).*/"\1 -> \2" \3 \4/p' >"$work/relay.dat"
  gnuplot <<GP
set terminal png size 860,480 font ",10"
set output "$OUT/outbox-relay.png"
set title "idem bench relay: messages/s, $MESSAGES messages over $KEYS keys, $PAYLOAD-byte payloads"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "messages/s"
set yrange [0:*]
set grid ytics
set key top right
plot "$work/relay.dat" using 2:xtic(1) title "end to end (the consumer saw every id)" lc rgb "#3a6ea5", \
     "" using 3 title "the relay's own (the broker confirmed every id)" lc rgb "#88bb55"
GP
  echo "wrote $OUT/outbox-relay.png" >&2
}
if command -v gnuplot >/dev/null; then
  plot_relay
else
  echo "gnuplot is not installed: no plot (apt-get install gnuplot-nox)" >&2
fi
echo "wrote $OUT/outbox-add.log, outbox-relay.log, outbox-latency.log, outbox-publish-batch.log" >&2
