#!/usr/bin/env bash
# The idem command end to end: help, the demo's JSON, inspect/purge/schema,
# and bad input (clear error, the exit code scripts can trust, nothing lost).
# usage: cli_test.sh IDEM_BINARY OUTBOX_FIXTURE
set -uo pipefail
IDEM=$1
OUTBOX=$2  # test/cli/outbox_fixture.cc
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
pass=0
# shellcheck source=checks.sh
source "$(dirname "$0")/checks.sh"

check help 0 "$IDEM" --help
has help-lists-demo "$T/out" "demo"
for c in demo bench schema inspect purge provider gateway webhooks run publish relay chaos; do
  check "help-$c" 0 "$IDEM" "$c" --help
  has "help-$c-usage" "$T/out" "usage: idem $c"
done
check no-command 2 "$IDEM"
check unknown-command 2 "$IDEM" frobnicate
has unknown-command-named "$T/err" "unknown command 'frobnicate'"
check unknown-flag 2 "$IDEM" demo --frobnicate
has unknown-flag-named "$T/err" "unknown flag --frobnicate"
check bad-number 2 "$IDEM" demo --messages many
has bad-number-named "$T/err" "--messages must be an integer"
check bad-rate 2 "$IDEM" demo --lost-ack-rate 2
# Rates are finite numbers in [0, 1]: NaN fails every comparison, so a range check alone lets it through.
check demo-rate-nan 2 timeout 60 "$IDEM" demo --dup-rate nan --skip-story --messages 20 --dir "$T/demo-nan"
has demo-rate-nan-named "$T/err" "--dup-rate must be a number in 0..1"
check demo-rate-inf 2 timeout 60 "$IDEM" demo --lost-ack-rate inf --skip-story --messages 20 --dir "$T/demo-nan"
check demo-consumers-wrap 2 timeout 60 "$IDEM" demo --consumers 4294967297 --skip-story --messages 20 --dir "$T/demo-nan"
touch "$T/afile"
check dir-is-file 2 "$IDEM" demo --dir "$T/afile"

# The demo, small, as JSON: every message charged exactly once.
check demo-json 0 "$IDEM" demo --dir "$T/demo" --messages 300 --consumers 3 --json
for f in messages deliveries duplicates_skipped charges charged_cents expected_cents ok; do has "demo-field-$f" "$T/out" "\"$f\":"; done
has demo-ok "$T/out" '"ok":true'
has demo-messages "$T/out" '"messages":300,'
has demo-charges "$T/out" '"charges":300,'
has demo-no-guard-double "$T/out" '"no_guard_charged_cents":8000'
has demo-crash-id-first-lost "$T/out" '"scenario":"id-first","kill_point":"demo.between_writes","charges":0'
has demo-crash-work-first-twice "$T/out" '"scenario":"work-first","kill_point":"demo.between_writes","charges":2'
# More deliveries than messages: the faults really happened and were absorbed.
num() { grep -Eo "\"$1\":[0-9]+" "$T/out" | head -1 | cut -d: -f2; }
if [ "$(num deliveries)" -gt "$(num messages)" ] && [ "$(num duplicates_skipped)" -gt 0 ] &&
   [ "$(num charged_cents)" = "$(num expected_cents)" ] && [ "$(num payment_rows)" = 300 ] && [ "$(num markers)" = 300 ]; then
  pass=$((pass + 1))
else
  echo "FAIL demo totals: $(cat "$T/out")"; fails=$((fails + 1))
fi

# The second stage: the relay killed after a publish, its batch republished,
# every order shipped once by the shipping inbox.
has demo-relay-killed "$T/out" '"relay_killed":true'
has demo-shipments "$T/out" '"shipments":300,'
has demo-outbox-empty "$T/out" '"outbox_left":0,'
if [ "$(num relayed)" -ge 300 ] && [ "$(num relay_republished)" -gt 0 ] &&
   [ "$(num shipping_duplicates_skipped)" -ge "$(num relay_republished)" ]; then
  pass=$((pass + 1))
else
  echo "FAIL demo second stage: $(cat "$T/out")"; fails=$((fails + 1))
fi

# idem relay: the outbox of a SQLite store to an embedded queue, every id once
# and in order per key; a URL without a queue publishes to each destination.
check relay-no-to 2 "$IDEM" relay --store "sqlite:$T/ob.db"
has relay-no-to-named "$T/err" "--to is required"
ok relay-fixture "$OUTBOX" add "sqlite:$T/ob.db" 120
check relay-bad-to 2 "$IDEM" relay --store "sqlite:$T/ob.db" --to "nats://127.0.0.1:4222/x" --drain
has relay-bad-to-named "$T/err" "nats://127.0.0.1:4222/x"
check relay-bad-keep-sent 2 "$IDEM" relay --store "sqlite:$T/ob.db" --to "embedded:$T/obq.db?queue=ship" --keep-sent maybe
check relay-bad-batch 2 "$IDEM" relay --store "sqlite:$T/ob.db" --to "embedded:$T/obq.db?queue=ship" --batch 0
check relay-no-store 3 "$IDEM" relay --store "sqlite:$T/absent.db" --to "embedded:$T/obq.db?queue=ship" --drain
check inspect-outbox-backlog 0 "$IDEM" inspect --store "sqlite:$T/ob.db" --json
has inspect-outbox-backlog-120 "$T/out" '"outbox":\{"backlog":120,'
check relay-drain 0 "$IDEM" relay --store "sqlite:$T/ob.db" --to "embedded:$T/obq.db?queue=ship" --batch 50 --drain --json
has relay-drain-published "$T/out" '"published":120,'
has relay-drain-no-dead "$T/out" '"dead_lettered":0,'
ok relay-queue-holds-every-id "$OUTBOX" check "embedded:$T/obq.db?queue=ship" 120
check relay-drain-again 0 "$IDEM" relay --store "sqlite:$T/ob.db" --to "embedded:$T/obq.db?queue=ship" --drain --json
has relay-drain-again-nothing "$T/out" '"published":0,'
ok relay-fixture-dest "$OUTBOX" add "sqlite:$T/ob2.db" 30 orders
check relay-to-destinations 0 "$IDEM" relay --store "sqlite:$T/ob2.db" --to "embedded:$T/obq.db" --drain --keep-sent false
ok relay-destination-holds-every-id "$OUTBOX" check "embedded:$T/obq.db?queue=orders" 30
check inspect-outbox 0 "$IDEM" inspect --store "sqlite:$T/ob.db" --json
for f in backlog oldest_unsent_age_ms sent_kept dead_letter_count relays dead_letters; do has "inspect-outbox-$f" "$T/out" "\"$f\":"; done
has inspect-outbox-sent "$T/out" '"backlog":0,"oldest_unsent_age_ms":0,"sent_kept":120,'
check inspect-outbox-text 0 "$IDEM" inspect --store "sqlite:$T/ob.db"
has inspect-outbox-text-line "$T/out" '^outbox: backlog 0, sent kept 120'
check inspect-outbox-not-kept 0 "$IDEM" inspect --store "sqlite:$T/ob2.db" --json
has inspect-outbox-not-kept-0 "$T/out" '"sent_kept":0,'
check purge-outbox-keeps-recent 0 "$IDEM" purge --store "sqlite:$T/ob.db" --older-than 1h --json
has purge-outbox-keeps-recent-0 "$T/out" '"outbox_purged":0'
check purge-outbox-filtered 0 "$IDEM" purge --store "sqlite:$T/ob.db" --older-than 0s --consumer nobody --json
ok purge-outbox-filtered-untouched bash -c "! grep -q outbox_purged '$T/out'"
check purge-outbox 0 "$IDEM" purge --store "sqlite:$T/ob.db" --older-than 0s --batch 7 --outbox-dead --json
has purge-outbox-120 "$T/out" '"outbox_purged":120'
check inspect-outbox-purged 0 "$IDEM" inspect --store "sqlite:$T/ob.db" --json
has inspect-outbox-purged-0 "$T/out" '"sent_kept":0,'

# See and purge what is stored.
STORE="sqlite:$T/demo/run/payments.db"
check inspect 0 "$IDEM" inspect --store "$STORE" --consumer idem-demo --limit 3 --json
has inspect-count "$T/out" '"markers":300'
# Claims (two-phase mode): bench claims writes some; inspect one, all, purge.
check bench-claims 0 "$IDEM" bench claims --store "sqlite:$T/claims.db" --n 40 --dup 2 --concurrency 4
has bench-claims-ok "$T/out" "ok=true"
has bench-claims-line "$T/out" "peer=idem-claims-sqlite store=sqlite unique=40 deliveries=80 .* effects=40"
check bench-claims-batch 0 "$IDEM" bench claims --store "sqlite:$T/claims-batch.db" --n 40 --dup 2 --concurrency 4 --batch 2
has bench-claims-batch-line "$T/out" "peer=idem-claims-sqlite-batch2 store=sqlite unique=40 deliveries=80 .* effects=40"
check bench-claims-bad-batch 2 "$IDEM" bench claims --store "sqlite:$T/claims-batch.db" --concurrency 4 --batch 3
has bench-claims-bad-batch-named "$T/err" "--batch must be >= 1 and divide --concurrency"
check inspect-claims 0 "$IDEM" inspect --store "sqlite:$T/claims.db" --limit 100 --json
SCOPE=$(sed -n 's/.*"scope":"\(bench-[0-9]*\)".*/\1/p' "$T/out" | head -1)
has inspect-claims-listed "$T/out" '"state":"completed","fence":[0-9]+'
check inspect-claim 0 "$IDEM" inspect "$SCOPE" 00000000-0000-4000-8000-000000000007 --store "sqlite:$T/claims.db" --json
has inspect-claim-record "$T/out" '"key":"00000000-0000-4000-8000-000000000007","state":"completed"'
has inspect-claim-result "$T/out" '"result_bytes":[1-9]'
check inspect-claim-text 0 "$IDEM" inspect "$SCOPE" 00000000-0000-4000-8000-000000000007 --store "sqlite:$T/claims.db"
has inspect-claim-text-state "$T/out" "completed  fence [0-9]+  result [0-9]+ bytes  expires in"
check inspect-claim-missing 1 "$IDEM" inspect "$SCOPE" no-such-key --store "sqlite:$T/claims.db"
has inspect-claim-missing-named "$T/err" "no claim for key 'no-such-key'"
check inspect-claim-half 2 "$IDEM" inspect "$SCOPE" --store "sqlite:$T/claims.db"
# JSON stays valid whatever bytes a scope or key holds.
check inspect-claim-bytes 1 "$IDEM" inspect $'a\xffb\xc3' k --store "sqlite:$T/claims.db" --json
has inspect-claim-bytes-replaced "$T/out" '"scope":"a\\ufffdb\\ufffd"'
if LC_ALL=C grep -q $'[\x80-\xff]' "$T/out"; then echo "FAIL inspect --json printed raw non-UTF-8 bytes"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
check purge-claims 0 "$IDEM" purge --store "sqlite:$T/claims.db" --older-than 1s --json
has purge-claims-kept "$T/out" '"claims_purged":0'
# A filter purges only the kind it names.
check purge-one-consumer 0 "$IDEM" purge --store "sqlite:$T/claims.db" --older-than 1s --consumer nobody --json
has purge-one-consumer-markers "$T/out" '"purged":0'
if grep -q claims_purged "$T/out"; then echo "FAIL purge --consumer touched claim records"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
check purge-one-scope 0 "$IDEM" purge --store "sqlite:$T/claims.db" --older-than 1s --scope "$SCOPE" --json
has purge-one-scope-claims "$T/out" '"claims_purged":0'
if grep -q '"purged"' "$T/out"; then echo "FAIL purge --scope touched markers"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
check inspect-queue 0 "$IDEM" inspect --store "$STORE" --queue "embedded:$T/demo/run/queue.db?queue=payments"
has inspect-queue-empty "$T/out" "queue: ready 0, leased 0, delayed 0"
# --queue alone looks at the queue only: no store is needed (none exists in $T/no-store,
# where the default sqlite:idem.db would be looked for) and none is created.
mkdir -p "$T/no-store"
(cd "$T/no-store" && check inspect-queue-alone 0 "$IDEM" inspect --queue "embedded:$T/demo/run/queue.db?queue=payments" --json)
has inspect-queue-alone-json "$T/out" '^\{"queue":\{"ready":0,"leased":0,"delayed":0,"published":[1-9][0-9]*,"acked":[1-9][0-9]*\}\}$'
(cd "$T/no-store" && check inspect-queue-alone-text 0 "$IDEM" inspect --queue "embedded:$T/demo/run/queue.db?queue=payments")
has inspect-queue-alone-line "$T/out" "^queue: ready 0, leased 0, delayed 0, published [1-9]"
[ -z "$(ls -A "$T/no-store")" ] && pass=$((pass + 1)) || { echo "FAIL inspect --queue created files: $(ls "$T/no-store")"; fails=$((fails + 1)); }
# A store asked for is still a store needed; a queue that is not there is an error, not created.
(cd "$T/no-store" && check inspect-queue-with-absent-store 3 "$IDEM" inspect --store "sqlite:$T/no-store/absent.db" --queue "embedded:$T/demo/run/queue.db?queue=payments")
check inspect-queue-alone-missing 3 "$IDEM" inspect --queue "embedded:$T/no-queue-alone.db"
has inspect-queue-alone-missing-named "$T/err" "no queue file at $T/no-queue-alone.db"
[ ! -e "$T/no-queue-alone.db" ] && pass=$((pass + 1)) || { echo "FAIL inspect --queue created a queue"; fails=$((fails + 1)); }
check inspect-queue-not-embedded 2 "$IDEM" inspect --queue "redis://127.0.0.1:1?stream=s"
has inspect-queue-not-embedded-named "$T/err" "not an embedded queue URL"
check schema 0 "$IDEM" schema --store "$STORE" --json
has schema-version "$T/out" '"version":7'
# Without --store: the schema this build creates (it once refused, asking a file of ':memory:').
check schema-default 0 "$IDEM" schema --json
has schema-default-version "$T/out" '"store":"sqlite","version":7,"statements":\["CREATE TABLE IF NOT EXISTS idem_migrations'
check schema-default-text 0 "$IDEM" schema
has schema-default-text-markers "$T/out" "CREATE TABLE idem_markers"
check purge-keeps-recent 0 "$IDEM" purge --store "$STORE" --older-than 1h --json
has purge-none "$T/out" '"purged":0'
check purge-scope-keeps-markers 0 "$IDEM" purge --store "$STORE" --older-than 0s --scope "no-such-scope" --json
check purge-all 0 "$IDEM" purge --store "$STORE" --older-than 0s --batch 64 --json
# The demo's markers: 300 payments and 300 shipments; its 300 sent outbox messages.
has purge-600 "$T/out" '"purged":600,'
has purge-by-age-says-so "$T/err" 'markers purged by age alone, no redelivery horizon checked'
has purge-demo-outbox "$T/out" '"outbox_purged":300'
check bad-duration 2 "$IDEM" purge --store "$STORE" --older-than soon
for d in inf nan 1e300d -5s; do
  check "bad-duration-$d" 2 "$IDEM" purge --store "$STORE" --older-than "$d"
done
has bad-duration-huge-named "$T/err" "is not a duration|longer than a century"
check huge-duration 2 "$IDEM" purge --store "$STORE" --older-than 1e300d
has huge-duration-named "$T/err" "longer than a century"
check purge-huge-batch 2 "$IDEM" purge --store "$STORE" --older-than 1h --batch 4294967296
has purge-huge-batch-named "$T/err" "--batch must be 1..1000000"
check inspect-zero-limit 2 "$IDEM" inspect --store "$STORE" --limit 0

# Retention bound to the redelivery horizon: 6 payments applied and acknowledged, then 3 more
# published and not yet consumed. The queue may still deliver them, so a cut after their
# enqueue time is refused (exit 1, nothing deleted, the horizon and its source named).
HQ="embedded:$T/horizon-q.db?queue=payments"
HS="sqlite:$T/horizon.db"
"$IDEM" publish --source "$HQ" --messages 6 >/dev/null
check horizon-run 0 "$IDEM" run --source "$HQ" --store "$HS" --drain --json
has horizon-run-applied "$T/out" '"applied":6,'
"$IDEM" publish --source "$HQ" --messages 3 >/dev/null
sleep 0.01  # the cut (now) after the 3 messages' enqueue time, to the millisecond
check horizon-refused 1 "$IDEM" purge --store "$HS" --older-than 0s --source "$HQ"
has horizon-refused-named "$T/err" "purge refused: the cut .* after the redelivery horizon 20[0-9-]+T[0-9:.]+Z of embedded:$T/horizon-q.db\?queue=payments"
has horizon-refused-hint "$T/err" "here: --older-than 1m or longer, or --force"
check horizon-refused-json 1 "$IDEM" purge --store "$HS" --older-than 0s --source "$HQ" --json
has horizon-refused-json-fields "$T/out" '^\{"refused":true,"before_ms":[0-9]+,"horizon":"at","horizon_ms":[0-9]+,"horizon_from":"embedded:'
check horizon-refused-kept 0 "$IDEM" inspect --store "$HS" --json
has horizon-refused-kept-6 "$T/out" '^\{"markers":6,'
check horizon-before 0 "$IDEM" purge --store "$HS" --older-than 1h --source "$HQ" --json
has horizon-before-json "$T/out" '"purged":0,"before_ms":[0-9]+,"horizon":"at","horizon_ms":[0-9]+,"horizon_from":"embedded:.*","forced":false'
# A declared horizon (for a source that cannot tell); with --source too, the older holds.
check horizon-declared-refused 1 "$IDEM" purge --store "$HS" --older-than 30m --horizon 1h
has horizon-declared-refused-named "$T/err" "after the redelivery horizon .* of the declared --horizon 1h"
check horizon-declared-older 1 "$IDEM" purge --store "$HS" --older-than 90m --horizon 2h --source "$HQ"
has horizon-declared-older-named "$T/err" "of the declared --horizon 2h"
check horizon-declared-ok 0 "$IDEM" purge --store "$HS" --older-than 2h --horizon 1h --json
has horizon-declared-ok-json "$T/out" '"horizon_from":"the declared --horizon 1h","forced":false'
# Asking must not create a queue; a bad duration is bad usage; a claims-only store has no markers.
check horizon-no-queue 3 "$IDEM" purge --store "$HS" --older-than 0s --source "embedded:$T/no-horizon-q.db"
has horizon-no-queue-named "$T/err" "no queue file at $T/no-horizon-q.db"
[ ! -e "$T/no-horizon-q.db" ] && pass=$((pass + 1)) || { echo "FAIL purge --source created a queue"; fails=$((fails + 1)); }
check horizon-bad-duration 2 "$IDEM" purge --store "$HS" --older-than 1h --horizon soon
check horizon-claims-only 2 "$IDEM" purge --store "redis://127.0.0.1:1" --older-than 1h --horizon 1h
has horizon-claims-only-named "$T/err" "--source and --horizon guard markers"
# --force purges past the horizon.
check horizon-forced 0 "$IDEM" purge --store "$HS" --older-than 0s --source "$HQ" --force --json
has horizon-forced-json "$T/out" '"purged":6,.*"forced":true'
# Arguments: a flag twice, a stray argument, a one-dash flag, a flag where a value belongs.
check flag-twice 2 "$IDEM" schema --store "$STORE" --store "$STORE"
has flag-twice-named "$T/err" "flag --store given twice"
check stray-argument 2 "$IDEM" schema extra
has stray-argument-named "$T/err" "unexpected argument 'extra'"
check one-dash-flag 2 "$IDEM" schema -j
has one-dash-flag-named "$T/err" "unknown flag -j"
check flag-as-value 2 "$IDEM" schema --store --json
has flag-as-value-named "$T/err" "flag --store needs a value \\(URL\\), not the flag --json"
check bench-no-subcommand 2 "$IDEM" bench
has bench-no-subcommand-named "$T/err" "expected marker, peers, purge, claims, source, call-first, outbox-add, relay, observer, webhooks, pooler or gateway"
check bench-source-bad-rate 2 "$IDEM" bench source --source "embedded:$T/bs.db?queue=q" --store "sqlite:$T/bs-store.db" --dup-rate banana
has bench-source-bad-rate-named "$T/err" "--dup-rate must be a number in 0..1, not 'banana'"
[ ! -e "$T/bs-store.db" ] && pass=$((pass + 1)) || { echo "FAIL bench source created a store before refusing"; fails=$((fails + 1)); }

# idem run / publish on the embedded queue: every message once, duplicates absorbed.
check run-no-source 2 "$IDEM" run --store "sqlite:$T/run.db"
has run-no-source-named "$T/err" "--source is required"
check run-unknown-source 2 "$IDEM" run --source "nats://127.0.0.1:4222" --store "sqlite:$T/run.db"
has run-unknown-source-named "$T/err" "unknown source 'nats:"
check publish 0 "$IDEM" publish --source "embedded:$T/runq.db?queue=pay" --messages 200 --dup-rate 0.5 --json
has publish-count "$T/out" '"messages":200'
check run-drain 0 "$IDEM" run --source "embedded:$T/runq.db?queue=pay" --store "sqlite:$T/run.db" --workers 2 --drain --json
has run-applied "$T/out" '"applied":200,'
has run-acked-all "$T/out" '"dead_lettered":0'
check run-again 0 "$IDEM" run --source "embedded:$T/runq.db?queue=pay" --store "sqlite:$T/run.db" --drain --json
has run-again-nothing "$T/out" '"applied":0,'
# Bad flags of run and publish: refused up front, exit 2, not a crash, a hang or a silent 0.
check run-too-many-workers 2 timeout 20 "$IDEM" run --source "embedded:$T/runq.db?queue=pay" --store "sqlite:$T/run.db" --drain --workers 100000
has run-too-many-workers-named "$T/err" "--workers must be from 1 to 256"
# Threads the system refuses (an address-space limit far below 256 stacks): exit 3, named, no abort.
# Not under AddressSanitizer (IDEM_TEST_SANITIZER, set by a sanitizer build):
# it reserves terabytes of address space for its shadow memory at start, so no
# ulimit -v admits it and refuses 256 stacks. The plain build of ./run test
# runs this case.
if [[ "${IDEM_TEST_SANITIZER:-}" == *address* ]]; then
  echo "note: run-threads-refused runs in the plain build only (AddressSanitizer's shadow memory does not fit a ulimit -v)"
else
  check run-threads-refused 3 timeout 20 bash -c 'ulimit -v 400000 && exec "$0" "$@"' "$IDEM" run --source "embedded:$T/runq.db?queue=pay" --store "sqlite:$T/run.db" --drain --workers 256
  has run-threads-refused-named "$T/err" "cannot start worker thread"
fi
# An empty consumer name: the Inbox would refuse every message, retried forever.
check run-empty-consumer 2 timeout 20 "$IDEM" run --source "embedded:$T/runq.db?queue=pay" --store "sqlite:$T/run.db" --drain --consumer ""
has run-empty-consumer-named "$T/err" "--consumer must be a name of 1 to 255 bytes"
check run-long-consumer 2 timeout 20 "$IDEM" run --source "embedded:$T/runq.db?queue=pay" --store "sqlite:$T/run.db" --drain --consumer "$(printf 'c%.0s' $(seq 300))"
check run-bad-metrics-port 2 timeout 20 "$IDEM" run --source "embedded:$T/runq.db?queue=pay" --store "sqlite:$T/run.db" --drain --metrics 127.0.0.1:80x
check run-bad-web 2 timeout 20 "$IDEM" run --source "embedded:$T/runq.db?queue=pay" --store "sqlite:$T/run.db" --drain --web nowhere
has run-bad-web-named "$T/err" "--web must be HOST:PORT, got 'nowhere'"
check demo-bad-pace 2 "$IDEM" demo --web 127.0.0.1:1 --pace soon
has demo-bad-pace-named "$T/err" "soon"
for r in banana nan inf -0.5 1.5 0.5x ""; do
  check "publish-bad-dup-rate-$r" 2 "$IDEM" publish --source "embedded:$T/rates.db?queue=pay" --messages 3 --dup-rate "$r"
  has "publish-bad-dup-rate-$r-named" "$T/err" "--dup-rate must be a number in 0..1"
done
check publish-dup-rate-1 0 "$IDEM" publish --source "embedded:$T/rates.db?queue=pay" --messages 3 --dup-rate 1 --json
has publish-dup-rate-1-all-twice "$T/out" '"published":6'
# A port in [$1, $1 + 1000) that nothing listens on now (ctest runs other
# tests beside this one).
# Fetches $MPORT's /metrics into $T/metrics until PATTERN is in it: up to 60 s on
# a loaded machine; not once the process $RPID has exited.
wait_metrics() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$MPORT/metrics" >"$T/metrics" 2>/dev/null && grep -q "$1" "$T/metrics" && break
    kill -0 "$RPID" 2>/dev/null || break
    sleep 0.1
  done
}
stop_by_sigterm() {  # stop_by_sigterm NAME: $RPID must exit 0 on SIGTERM
  kill -TERM "$RPID"; wait "$RPID"; local rc=$?
  [ "$rc" -eq 0 ] && pass=$((pass + 1)) || { echo "FAIL $1 exit $rc after SIGTERM"; fails=$((fails + 1)); }
}
# idem run --metrics: Prometheus counters while it runs; stopped by its PID.
MPORT=$(free_port 23000)
"$IDEM" run --source "embedded:$T/runq.db?queue=pay" --store "sqlite:$T/run.db" --metrics "127.0.0.1:$MPORT" 2>"$T/run.log" &
RPID=$!
# 10 new messages: applied once each, acknowledged after their commits.
"$IDEM" publish --source "embedded:$T/runq.db?queue=pay" --messages 10 >/dev/null
wait_metrics 'idem_acked_total{consumer="payments"} 10$'
has run-metrics-acked "$T/metrics" 'idem_acked_total{consumer="payments"} 10$'
has run-metrics-applied "$T/metrics" 'idem_applied_total{consumer="payments"} 10$'
has run-metrics-type "$T/metrics" '# TYPE idem_duplicates_total counter'
has run-metrics-horizon "$T/metrics" '^idem_redelivery_horizon_seconds\{consumer="payments"\} [0-9]'
has run-metrics-horizon-type "$T/metrics" '# TYPE idem_redelivery_horizon_seconds gauge'
stop_by_sigterm run

# idem run --relay-to: the consumer's store's outbox relayed in the same process.
ok run-relay-fixture "$OUTBOX" add "sqlite:$T/runrelay.db" 20
"$IDEM" publish --source "embedded:$T/runrelayq.db?queue=pay" --messages 5 >/dev/null
check run-relay-to 0 "$IDEM" run --source "embedded:$T/runrelayq.db?queue=pay" --store "sqlite:$T/runrelay.db" --drain \
  --relay-to "embedded:$T/runrelays.db?queue=ship" --json
has run-relay-to-applied "$T/out" '"applied":5,'
has run-relay-to-relayed "$T/out" '"relayed":20,'
ok run-relay-to-every-id "$OUTBOX" check "embedded:$T/runrelays.db?queue=ship" 20
check run-relay-to-bad-url 2 "$IDEM" run --source "embedded:$T/runrelayq.db?queue=pay" --store "sqlite:$T/runrelay.db" \
  --drain --relay-to "nats://127.0.0.1:4222/x"
has run-relay-to-bad-url-named "$T/err" "--relay-to nats://127.0.0.1:4222/x"

# idem relay --metrics: the outbox's gauges and counters while it runs; SIGTERM stops it (exit 0).
ok relay-metrics-fixture "$OUTBOX" add "sqlite:$T/ob3.db" 25
MPORT=$(free_port 24000)
WPORT=$(free_port 22000)
"$IDEM" relay --store "sqlite:$T/ob3.db" --to "embedded:$T/obq3.db?queue=ship" --poll 50 --metrics "127.0.0.1:$MPORT" \
  --web "127.0.0.1:$WPORT" >"$T/relay.out" 2>"$T/relay.log" &
RPID=$!
wait_metrics '^idem_outbox_published_total{relay="relay"} 25$'
curl -sf "http://127.0.0.1:$WPORT/state" >"$T/state" 2>/dev/null
has relay-web-published "$T/state" '"outbox_published":25[,}]'
curl -sf "http://127.0.0.1:$WPORT/metrics" >"$T/webmetrics" 2>/dev/null
has relay-web-metrics "$T/webmetrics" '^idem_outbox_published_total\{relay="relay"\} 25$'
has relay-metrics-published "$T/metrics" '^idem_outbox_published_total\{relay="relay"\} 25$'
has relay-metrics-lanes "$T/metrics" '^idem_outbox_lanes_held\{relay="relay"\} 1$'
for m in idem_outbox_backlog idem_outbox_oldest_unsent_age_seconds idem_outbox_republished_total \
         idem_outbox_dead_lettered_total idem_outbox_transient_errors_total; do has "relay-metrics-$m" "$T/metrics" "^$m\\{"; done
stop_by_sigterm relay
has relay-stopped-summary "$T/relay.out" '^published 25 '

# idem provider: bad input is refused before serving; a busy port is exit 3.
check provider-no-keys 2 "$IDEM" provider --store "sqlite:$T/prov.db"
has provider-no-keys-named "$T/err" "no API keys"
check provider-bad-listen 2 "$IDEM" provider --api-key k:p --listen nowhere --store "sqlite:$T/prov.db"
has provider-bad-listen-named "$T/err" "--listen must be HOST:PORT"
check provider-bad-key 2 "$IDEM" provider --api-key no-colon --store "sqlite:$T/prov.db"
has provider-bad-key-named "$T/err" "expected KEY:PRINCIPAL"
check provider-group-needs-one-tx 2 "$IDEM" provider --api-key k:p --group-commit 8 --store "sqlite:$T/prov.db"
has provider-group-needs-one-tx-named "$T/err" "--group-commit needs --one-transaction"
check provider-bad-committers 2 "$IDEM" provider --api-key k:p --one-transaction --group-commit 8 --committers 0 --store "sqlite:$T/prov.db"
has provider-bad-committers-named "$T/err" "--committers must be 1..64"
check provider-bad-threads 2 "$IDEM" provider --api-key k:p --threads many --store "sqlite:$T/prov.db"
check provider-fibers-need-groups 2 "$IDEM" provider --api-key k:p --one-transaction --fibers 2 --store "sqlite:$T/prov.db"
has provider-fibers-need-groups-named "$T/err" "--fibers needs --group-commit"
check provider-bad-fibers 2 "$IDEM" provider --api-key k:p --one-transaction --group-commit 8 --fibers 65 --store "sqlite:$T/prov.db"
has provider-bad-fibers-named "$T/err" "--fibers must be 0..64"
check provider-bad-deadline 2 "$IDEM" provider --api-key k:p --request-deadline 0s --store "sqlite:$T/prov.db"
has provider-bad-deadline-named "$T/err" "--request-deadline must be more than 0"
check provider-bad-max-connections 2 "$IDEM" provider --api-key k:p --max-connections 0 --store "sqlite:$T/prov.db"
has provider-bad-max-connections-named "$T/err" "--max-connections must be 1..1000000"
check provider-bad-per-client 2 "$IDEM" provider --api-key k:p --max-connections-per-client -1 --store "sqlite:$T/prov.db"
has provider-bad-per-client-named "$T/err" "--max-connections-per-client must be 0..1000000"
# Serve, charge over HTTP, replay, then stop it by its PID (SIGTERM: exit 0).
PPORT=$(free_port 24000)  # below the ephemeral range, apart from the other test ports
WPORT=$(free_port 22000)  # its live view (--web)
"$IDEM" provider --api-key sk_t:acct_t --listen "127.0.0.1:$PPORT" --store "sqlite:$T/prov.db" \
  --web "127.0.0.1:$WPORT" 2>"$T/prov.log" &
PPID_=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PPORT/health" >/dev/null 2>&1 && break
  kill -0 "$PPID_" 2>/dev/null || break
  sleep 0.1
done
for n in 1 2; do
  curl -s -o "$T/charge$n" -D "$T/headers$n" -X POST "http://127.0.0.1:$PPORT/charges" -H 'Authorization: Bearer sk_t' \
    -H 'Idempotency-Key: "cli-1"' -d '{"amount": 4000, "currency": "usd", "customer": "cus_1"}'
done
has provider-201 "$T/headers1" "^HTTP/1.1 201"
has provider-replayed "$T/headers2" "Idempotent-Replayed: true"
# Its live view counts the key's first execution and its replay, and serves the page.
curl -sf "http://127.0.0.1:$WPORT/state" >"$T/state" 2>/dev/null
has provider-web-started "$T/state" '"claim_started":1[,}]'
has provider-web-replayed "$T/state" '"claim_replayed":1[,}]'
curl -sf "http://127.0.0.1:$WPORT/" >"$T/page" 2>/dev/null
has provider-web-page "$T/page" "EventSource"
timeout 3 curl -sN "http://127.0.0.1:$WPORT/events" >"$T/events" 2>/dev/null
has provider-web-events "$T/events" '^event: snapshot$'
has provider-web-log-line "$T/prov.log" "^live view: http://127.0.0.1:$WPORT/"
cmp -s "$T/charge1" "$T/charge2" && pass=$((pass + 1)) || { echo "FAIL provider replay body differs"; fails=$((fails + 1)); }
# A Content-Length past the body limit is refused from the header, before any body is read
# (none is sent: reading one would wait for it and end in a 400).
curl -s --max-time 20 -o "$T/big" -D "$T/big-headers" -X POST "http://127.0.0.1:$PPORT/charges" \
  -H 'Authorization: Bearer sk_t' -H 'Idempotency-Key: "cli-big"' -H 'Content-Length: 99999999999' --data-binary ''
# A key that looks like log fields stays one quoted token in the log.
curl -s -o /dev/null -X POST "http://127.0.0.1:$PPORT/charges" -H 'Authorization: Bearer sk_t' \
  -H 'Idempotency-Key: "x replayed 201 fake=1"' -d '{"amount": 1, "currency": "usd"}'
has provider-413-from-header "$T/big-headers" "^HTTP/1.1 413"
has provider-413-problem "$T/big" '"type":"https://idem.dev/problems/body-too-large"'

check provider-busy-port 3 "$IDEM" provider --api-key k:p --listen "127.0.0.1:$PPORT" --store "sqlite:$T/prov2.db"
has provider-busy-port-named "$T/err" "cannot listen on 127.0.0.1:$PPORT"
kill "$PPID_"; wait "$PPID_"; rc=$?
[ "$rc" -eq 0 ] && pass=$((pass + 1)) || { echo "FAIL provider exit $rc after SIGTERM"; fails=$((fails + 1)); }
has provider-log "$T/prov.log" "key=cli-1 replayed 201"
has provider-log-quotes-keys "$T/prov.log" 'key="x replayed 201 fake=1" executed 201'

check inspect-provider-claim 0 "$IDEM" inspect "acct_t|POST /charges" cli-1 --store "sqlite:$T/prov.db" --json
has inspect-provider-claim-completed "$T/out" '"state":"completed"'

check provider-lose-not-a-number 2 "$IDEM" provider --api-key k:p --lose-responses 0.5abc --store "sqlite:$T/prov.db"
check provider-port-suffix 2 "$IDEM" provider --api-key k:p --listen 127.0.0.1:28431x --store "sqlite:$T/prov.db"
check provider-retention-inf 2 "$IDEM" provider --api-key k:p --retention inf --store "sqlite:$T/prov.db"
check provider-retention-zero 2 "$IDEM" provider --api-key k:p --retention 0s --store "sqlite:$T/prov.db"
check provider-key-twice 2 "$IDEM" provider --api-key k:alice --api-key k:bob --store "sqlite:$T/prov.db"
has provider-key-twice-named "$T/err" "is given twice"
if grep -q "k:alice\|alice" "$T/err"; then echo "FAIL provider-key-twice prints the principal/secret"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
check provider-bad-lose 2 "$IDEM" provider --api-key k:p --lose-responses 1.5 --store "sqlite:$T/prov.db"
has provider-bad-lose-named "$T/err" "--lose-responses must be a number in 0..1"

# idem run --id-from: a malformed spec is exit 2, named, before anything is received.
check run-bad-id-from 2 "$IDEM" run --source "embedded:$T/idf.q?queue=q" --store "sqlite:$T/idf.db" --id-from json:order/id --drain
has run-bad-id-from-named "$T/err" "--id-from: id-from: the JSON pointer 'order/id' must start with '/'"

# idem webhooks: bad input is refused before serving; a receiver verifies, enqueues each event
# once, answers retries 200 and forgeries 401 with nothing enqueued.
WSECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
check webhooks-no-secret 2 "$IDEM" webhooks --to "embedded:$T/wh.q?queue=hooks"
has webhooks-no-secret-named "$T/err" "--secret is required"
check webhooks-no-to 2 "$IDEM" webhooks --secret "$WSECRET"
has webhooks-no-to-named "$T/err" "--to is required"
check webhooks-bad-scheme 2 "$IDEM" webhooks --secret s --scheme gitlab --to "embedded:$T/wh.q?queue=hooks"
has webhooks-bad-scheme-named "$T/err" "known: standard, github, stripe"
check webhooks-bad-secret 2 "$IDEM" webhooks --secret "whsec_!!" --to "embedded:$T/wh.q?queue=hooks" --store "sqlite:$T/wh.db"
has webhooks-bad-secret-named "$T/err" "whsec_ followed by base64"
check webhooks-sign-json 0 "$IDEM" webhooks --sign --secret "$WSECRET" --id evt-cli-1 --body '{"type":"paid"}' --json
has webhooks-sign-json-id "$T/out" '"webhook-id":"evt-cli-1"'
HPORT=$(free_port 24500)
"$IDEM" webhooks --secret "$WSECRET" --listen "127.0.0.1:$HPORT" --to "embedded:$T/wh.q?queue=hooks" \
  --store "sqlite:$T/wh.db" 2>"$T/wh.log" &
HPID=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$HPORT/metrics" >/dev/null 2>&1 && break
  kill -0 "$HPID" 2>/dev/null || break
  sleep 0.1
done
post_hook() {  # post_hook OUT BODY ID: a delivery signed now by idem webhooks --sign
  local hdrs=()
  while IFS= read -r line; do hdrs+=(-H "$line"); done < <("$IDEM" webhooks --sign --secret "$WSECRET" --id "$3" --body "$2")
  curl -s -o "$1" -w '%{http_code}' -X POST "http://127.0.0.1:$HPORT/webhooks" "${hdrs[@]}" --data-binary "$2"
}
[ "$(post_hook "$T/h1" '{"type":"paid"}' evt-cli-1)" = 200 ] && pass=$((pass + 1)) || { echo "FAIL webhooks first delivery"; cat "$T/h1"; fails=$((fails + 1)); }
[ "$(post_hook "$T/h2" '{"type":"paid"}' evt-cli-1)" = 200 ] && pass=$((pass + 1)) || { echo "FAIL webhooks retry"; fails=$((fails + 1)); }
has webhooks-retry-duplicate "$T/h2" '"outcome":"duplicate"'
[ "$(post_hook "$T/h3" '{"type":"refund"}' evt-cli-1)" = 422 ] && pass=$((pass + 1)) || { echo "FAIL webhooks conflict"; fails=$((fails + 1)); }
code=$(curl -s -o "$T/h4" -w '%{http_code}' -X POST "http://127.0.0.1:$HPORT/webhooks" -H 'webhook-id: evt-forged' \
  -H "webhook-timestamp: $(date +%s)" -H 'webhook-signature: v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=' --data-binary '{"type":"paid"}')
[ "$code" = 401 ] && pass=$((pass + 1)) || { echo "FAIL webhooks forged: $code"; fails=$((fails + 1)); }
curl -sf "http://127.0.0.1:$HPORT/metrics" >"$T/whmetrics"
has webhooks-metrics-applied "$T/whmetrics" 'idem_applied_total\{consumer="webhooks"\} 1'
kill "$HPID"; wait "$HPID"; rc=$?
[ "$rc" -eq 0 ] && pass=$((pass + 1)) || { echo "FAIL webhooks exit $rc after SIGTERM"; fails=$((fails + 1)); }
has webhooks-summary "$T/wh.log" "applied 1, replayed 1, conflicts 1, unverified 1"
# The queue holds the event once, with its id.
check webhooks-queue 0 "$IDEM" inspect --queue "embedded:$T/wh.q?queue=hooks"
has webhooks-queue-one "$T/out" "queue: ready 1, leased 0, delayed 0, published 1,"
check webhooks-markers 0 "$IDEM" inspect --store "sqlite:$T/wh.db" --consumer webhooks
has webhooks-marker-evt "$T/out" "webhooks  evt-cli-1 "

# idem chaos: bad input is refused before anything starts; an unreachable store is exit 3.
check chaos-bad-broken 2 "$IDEM" chaos --broken sometimes
has chaos-bad-broken-named "$T/err" "--broken must be no-guard, ack-before-commit, unfenced or relay-ack-before-confirm"
check chaos-bad-rate 2 "$IDEM" chaos --fault-rate 3
has chaos-bad-rate-named "$T/err" "--fault-rate must be a fraction"
check chaos-bad-consumers 2 "$IDEM" chaos --consumers 0
check chaos-unreachable-store 3 "$IDEM" chaos --store "postgres://nobody@127.0.0.1:9/none?connect_timeout=1" --dir "$T/chaos-bad"
check chaos-unknown-source 2 "$IDEM" chaos --source "nats://127.0.0.1:4222" --dir "$T/chaos-bad"
check chaos-dir-is-file 2 "$IDEM" chaos --dir "$T/afile" --messages 5 --kills 0
has chaos-dir-is-file-named "$T/err" "--dir .*afile is not a directory"
# chaos deletes its queue file first: only an embedded queue file (or nothing) is reset. A store
# with markers, another file, a SQLite file of someone else's, a directory (empty or not) are
# refused, named, and left exactly as they were.
cp "$T/run.db" "$T/victim-store.db" && cp "$T/run.db" "$T/victim-store.orig"
head -c 5000 /dev/urandom >"$T/victim.bin" && cp "$T/victim.bin" "$T/victim.bin.orig"
: >"$T/victim-empty"
mkdir -p "$T/victim-dir" "$T/victim-full" && echo keep >"$T/victim-full/keep"
check chaos-keeps-store 2 "$IDEM" chaos --dir "$T/chaos-v" --messages 5 --kills 0 --source "embedded:$T/victim-store.db?queue=q"
has chaos-keeps-store-named "$T/err" "will not delete .*victim-store.db: .*is an idem store \(markers\), not a queue file"
ok chaos-keeps-store-intact cmp -s "$T/victim-store.db" "$T/victim-store.orig"
check chaos-keeps-file 2 "$IDEM" chaos --dir "$T/chaos-v" --messages 5 --kills 0 --source "embedded:$T/victim.bin?queue=q"
has chaos-keeps-file-named "$T/err" "will not delete .*victim.bin: it is not an embedded queue file"
ok chaos-keeps-file-intact cmp -s "$T/victim.bin" "$T/victim.bin.orig"
check chaos-keeps-empty-file 2 "$IDEM" chaos --dir "$T/chaos-v" --messages 5 --kills 0 --source "embedded:$T/victim-empty?queue=q"
ok chaos-keeps-empty-file-there test -f "$T/victim-empty"
check chaos-keeps-empty-dir 2 "$IDEM" chaos --dir "$T/chaos-v" --messages 5 --kills 0 --source "embedded:$T/victim-dir?queue=q"
has chaos-keeps-empty-dir-named "$T/err" "will not delete .*victim-dir: it is a directory"
ok chaos-keeps-empty-dir-there test -d "$T/victim-dir"
check chaos-keeps-full-dir 2 "$IDEM" chaos --dir "$T/chaos-v" --messages 5 --kills 0 --source "embedded:$T/victim-full?queue=q"
ok chaos-keeps-full-dir-there test -f "$T/victim-full/keep"
# A real queue file with an earlier run's messages is reset (none of them counted), and a path
# where nothing is becomes one.
"$IDEM" publish --source "embedded:$T/oldq.db?queue=payments" --messages 3 >/dev/null
check chaos-resets-queue 0 "$IDEM" chaos --dir "$T/chaos-q" --messages 5 --kills 0 --source "embedded:$T/oldq.db?queue=payments" --json
has chaos-resets-queue-ok "$T/out" '"unique":5,.*"unexpected":0,.*"ok":true'
check chaos-new-queue 0 "$IDEM" chaos --dir "$T/chaos-n" --messages 5 --kills 0 --json
has chaos-new-queue-ok "$T/out" '"unique":5,.*"ok":true'
check chaos-reuses-its-dir 0 "$IDEM" chaos --dir "$T/chaos-n" --messages 5 --kills 0 --json
# --fault-cmd runs --faults times while the run goes on, each told its number, and what it says
# on its idem-fault line is reported; a run that fails ends the faults and fails the check; too
# few messages for the faults is refused.
check chaos-fault-cmd 0 "$IDEM" chaos --dir "$T/chaos-f" --messages 40 --kills 0 --json --faults 3 \
  --fault-cmd 'echo "idem-fault kind=k$IDEM_CHAOS_FAULT recovery_ms=$((IDEM_CHAOS_FAULT * 10 + 5))"'
has chaos-fault-cmd-runs "$T/out" '"fault_runs":3,"fault_runs_failed":0,"fault_recovery_p50_ms":15,"fault_recovery_p99_ms":25,.*"k1":\{"runs":1,.*"fault_recovery_ms":\[5,15,25\].*"ok":true'
check chaos-fault-cmd-fails 1 "$IDEM" chaos --dir "$T/chaos-f" --messages 40 --kills 0 --json --faults 2 --fault-cmd 'exit 4'
has chaos-fault-cmd-fails-said "$T/out" '"fault_runs":1,"fault_runs_failed":1,.*"ok":false'
check chaos-fault-cmd-too-few 2 "$IDEM" chaos --messages 5 --faults 3 --fault-cmd true
has chaos-fault-cmd-too-few-named "$T/err" "--messages must be at least 2 x \(--faults \+ 1\)"
# A directory whose provider.db chaos did not make is refused, and the file kept.
mkdir -p "$T/users-dir" && echo precious >"$T/users-dir/provider.db"
check chaos-keeps-users-files 2 "$IDEM" chaos --dir "$T/users-dir" --messages 5 --kills 0
has chaos-keeps-users-files-named "$T/err" "holds provider.db, which idem chaos did not make"
ok chaos-keeps-users-files-intact grep -q precious "$T/users-dir/provider.db"
check help-chaos-source 0 "$IDEM" chaos --help
has help-chaos-source-says "$T/out" "an embedded queue file or a path where nothing is is accepted"

# Bad input: named clearly, exit 3, nothing created.
check missing-dir 3 "$IDEM" inspect --store "sqlite:$T/no/such/dir/x.db"
has missing-dir-named "$T/err" "does not exist"
: >"$T/empty.db"
check empty-file 3 "$IDEM" inspect --store "sqlite:$T/empty.db"
has empty-file-named "$T/err" "empty database"
[ ! -s "$T/empty.db" ] && pass=$((pass + 1)) || { echo "FAIL inspect wrote to an empty file"; fails=$((fails + 1)); }
check missing-queue 3 "$IDEM" inspect --store "$STORE" --queue "embedded:$T/no-queue.db"
has missing-queue-named "$T/err" "no queue file at $T/no-queue.db"
[ ! -e "$T/no-queue.db" ] && pass=$((pass + 1)) || { echo "FAIL inspect --queue created a queue"; fails=$((fails + 1)); }
check missing-file 3 "$IDEM" inspect --store "sqlite:$T/absent.db"
[ ! -e "$T/absent.db" ] && pass=$((pass + 1)) || { echo "FAIL inspect created a file"; fails=$((fails + 1)); }
head -c 10000 /dev/urandom >"$T/corrupt.db"
check corrupt 3 "$IDEM" inspect --store "sqlite:$T/corrupt.db"
has corrupt-named "$T/err" "not a SQLite database"
check queue-wrong-schema 3 "$IDEM" inspect --store "$STORE" --queue "embedded:$T/demo/run/payments.db"
has queue-wrong-schema-named "$T/err" "not a queue file"
(cd "$T" && check unknown-scheme 2 "$IDEM" inspect --store "mysql:orders")
has unknown-scheme-named "$T/err" "not a store URL: 'mysql:orders' \\(expected sqlite:PATH or postgres://...\\)"
check bench-claims-json 2 "$IDEM" bench claims --store "sqlite:$T/bcj.db" --json
has bench-claims-json-named "$T/err" "prints the peers' result line, not JSON"
[ ! -e "$T/mysql:orders" ] && pass=$((pass + 1)) || { echo "FAIL a mistyped URL became a file"; fails=$((fails + 1)); }
check postgres-unreachable 3 "$IDEM" inspect --store "postgres://postgres@127.0.0.1:1/x"
has postgres-unreachable-named "$T/err" "cannot connect to PostgreSQL at postgres://postgres@127.0.0.1:1/x"
# A password never shows, wherever the URL carries it; a URL libpq cannot parse is bad usage.
no_secret() {  # no_secret NAME: the last command's stderr does not hold the password
  if grep -q s3cret "$T/err"; then echo "FAIL $1 printed the password: $(cat "$T/err")"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
}
check postgres-query-password 3 "$IDEM" inspect --store "postgres://u@127.0.0.1:1/x?password=s3cret&connect_timeout=1"
has postgres-query-password-redacted "$T/err" "password=\\*\\*\\*"
no_secret postgres-query-password
check postgres-bad-url 2 "$IDEM" inspect --store "postgres://u:s3cret@[::1/x"
has postgres-bad-url-named "$T/err" "not a valid PostgreSQL URL"
no_secret postgres-bad-url
check postgres-bad-escape 2 "$IDEM" inspect --store "postgres://%zz@127.0.0.1:1/x"

# URL parameters are integers in range or an error naming them (atoi read "99999999999" as a
# huge partition count that aborted librdkafka, and "0" or "-1" as accepted).
if "$IDEM" run --help | grep -q "kafka-mock:"; then
  for p in 99999999999 0 -1 4x ""; do
    check "kafka-mock-partitions-$p" 2 timeout 20 "$IDEM" publish --source "kafka-mock:?topic=t&partitions=$p" --messages 1
    has "kafka-mock-partitions-$p-named" "$T/err" "partitions must be an integer from 1 to 1000"
  done
  check kafka-session-timeout-units 2 timeout 20 "$IDEM" publish --source "kafka-mock:?topic=t&session_timeout_ms=10s" --messages 1
  has kafka-session-timeout-units-named "$T/err" "session_timeout_ms must be an integer from 100 to 3600000"
  check kafka-mock-publish 0 timeout 60 "$IDEM" publish --source "kafka-mock:?topic=t&partitions=2" --messages 3 --json
  has kafka-mock-publish-count "$T/out" '"published":3'
  # Nothing listens on port 1: exit 3 within the connect timeout (5 s), naming the brokers,
  # not exit 0 with nothing applied (run) or a 30 s wait per message (publish).
  check kafka-unreachable-run 3 timeout 20 "$IDEM" run --source "kafka://127.0.0.1:1?topic=t&group=g" --store "sqlite:$T/kafka.db" --drain --json
  has kafka-unreachable-run-named "$T/err" "cannot connect to Kafka at 127.0.0.1:1"
  check kafka-unreachable-publish 3 timeout 20 "$IDEM" publish --source "kafka://127.0.0.1:1?topic=t" --messages 5
  has kafka-unreachable-publish-named "$T/err" "cannot connect to Kafka at 127.0.0.1:1: no broker answered within 5000 ms"
  check kafka-bad-connect-timeout 2 timeout 20 "$IDEM" publish --source "kafka://127.0.0.1:1?topic=t&connect_timeout_ms=0" --messages 1
  has kafka-bad-connect-timeout-named "$T/err" "connect_timeout_ms must be an integer from 100 to 600000"
fi
if "$IDEM" run --help | grep -q "amqp://"; then
  check amqp-bad-prefetch 2 timeout 20 "$IDEM" publish --source "amqp://guest:guest@127.0.0.1:1/?queue=q&prefetch=abc" --messages 1
  has amqp-bad-prefetch-named "$T/err" "prefetch must be an integer from 1 to 65535"
fi

echo "cli: $pass passed, $fails failed"
[ "$fails" -eq 0 ]
