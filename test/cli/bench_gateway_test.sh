#!/usr/bin/env bash
# `idem bench gateway`, tiny, on SQLite (a temporary directory of its own):
# exit 0, one JSON object on stdout whose fields are all there and whose
# counts add up; no timing is checked.
#   bench_gateway_test.sh IDEM
set -euo pipefail
IDEM=$1
out=$("$IDEM" bench gateway --rounds 1 --requests 20 --latency-requests 5 --clients 4 --upstream-delay-ms 1 --json)
echo "$out"
fail() { echo "bench_gateway_test: $*" >&2; exit 1; }
[ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "not one line of JSON"
has() { printf '%s' "$out" | grep -Eq -- "$1" || fail "no match for $1"; }
has '^\{"bench":"gateway",'
has '"store":"sqlite"'
has '"upstream_delay_ms":1[,}]'
has '"clients":4[,}]'
# Throughput per mode: the rate, per request the CPU time (this process and
# the machine) and this process's thread switches, and the requests' latency
# under that load.
LOADED='"loaded_mean_ms":[0-9.e+-]+,"loaded_p50_ms":[0-9.e+-]+,"loaded_p99_ms":[0-9.e+-]+,'
TP="\"context_switches\":[0-9.e+-]+,$LOADED\"machine_busy_cores\":[0-9.e+-]+,\"machine_cpu_us\":[0-9.e+-]+,"
CPU='"process_cpu_us":[0-9.e+-]+,'
# Per mode, warm-up (5 + 20) and measured (5 + 20) requests: 50 each.
for m in direct_first gateway_first direct_replay gateway_replay; do
  has "\"$m\":\\{\"p50_ms\":[0-9.e+-]+,\"p99_ms\":[0-9.e+-]+,\"requests\":5\\}"
  has "\"$m\":\\{$TP\"median_per_s\":[0-9.e+-]+,\"per_s_rounds\":\\[[0-9.e+-]+\\],$CPU\"requests\":20\\}"
  has "\"$m\":50[,}]"
done
has '"added_first":\{"p50_ms":-?[0-9.e+-]+,"p99_ms":-?[0-9.e+-]+\}'
has '"added_replay":\{"p50_ms":-?[0-9.e+-]+,"p99_ms":-?[0-9.e+-]+\}'
# The ratios, round by round and their median: gateway/direct (first
# executions, replays), the hop alone (pass/direct) and the store's part
# (gateway/pass).
for r in first first_to_pass pass replay; do
  has "\"ratio_$r\":[0-9.e+-]+,\"ratio_${r}_rounds\":\\[[0-9.e+-]+\\]"
done
# First executions through the gateway on a path it does not guard: 20
# warm-up and 20 measured, each forwarded once.
has "\"pass_first\":\\{$TP\"median_per_s\":[0-9.e+-]+,\"per_s_rounds\":\\[[0-9.e+-]+\\],$CPU\"requests\":20\\}"
has '"pass_first":40[,}]'
for t in first_added_p99_ms replay_added_p99_ms throughput_ratio_first; do
  has "\"$t\":\\{\"met\":(true|false),\"target\":[0-9.]+,\"value\":-?[0-9.e+-]+\\}"
done
# The counts: 240 requests, 100 at the upstream direct, 50 through the
# gateway (its first executions, each once), 50 replayed by the gateway,
# 40 unguarded through it.
has '"checks":\{"gateway_forwarded":50,"gateway_outcome_unknown":0,"gateway_replayed":50,"not_201":0,"ok":true,"requests":240,'
has '"upstream_calls_direct":100,"upstream_calls_unguarded":40,"upstream_calls_via_gateway":50,"upstream_repeats_via_gateway":0'
# What a first execution's answer waits for, read from the store: FULL by
# default; a store URL that asks for less is said so (not the default's words).
has '"durability":"SQLite WAL synchronous=FULL: each claim and completion fsynced before it answers"'
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
out=$("$IDEM" bench gateway --store "sqlite:$dir/g.db?synchronous=normal" --rounds 1 --requests 4 --latency-requests 2 \
  --clients 2 --upstream-delay-ms 1 --json)
has '"durability":"SQLite WAL synchronous=NORMAL: commits survive the process, not the machine'
# Bad flags: exit 2.
set +e
"$IDEM" bench gateway --clients 0 >/dev/null 2>&1; [ $? = 2 ] || fail "--clients 0 did not exit 2"
"$IDEM" bench gateway --store redis://x >/dev/null 2>&1; [ $? = 2 ] || fail "--store redis:// did not exit 2"
echo "bench_gateway_test: ok"
