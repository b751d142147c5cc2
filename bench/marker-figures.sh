#!/usr/bin/env bash
# Runs the marker benchmark's cases (doc/performance.md) and draws their
# ratios as bench/results/marker-ratios-N.png from the JSON the runs print
# (bench/results/marker-N.jsonl).
#   bench/marker-figures.sh                    # RETAINED=1000000
#   RETAINED=10000000 bench/marker-figures.sh  # the issue's 10M (long: the first run writes them)
#   STORES=sqlite bench/marker-figures.sh      # SQLite only
# Needs gnuplot (apt-get install gnuplot-nox) and python3 for the plot only.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
RETAINED=${RETAINED:-1000000}
OUT=${OUT:-$ROOT/bench/results}
WORK=${WORK:-/tmp/idem-marker-figures}
PG_PORT=${PG_PORT:-55451}
mkdir -p "$OUT" "$WORK"
J=$OUT/marker-$RETAINED.jsonl
run() { echo "== $*" >&2; "$IDEM" bench marker --retained "$RETAINED" --json "$@" | tee -a "$J"; }

# PLOT_ONLY=1: draw again from the JSON of the last run, measure nothing.
if [ -z "${PLOT_ONLY:-}" ]; then
: >"$J"

run --store "sqlite:$WORK/random.db" --ids random --batch 100
run --store "sqlite:$WORK/ordered.db" --ids ordered --batch 100
run --store "sqlite:$WORK/random.db" --ids random --batch 1
run --store "sqlite:$WORK/ptime.db" --ids random --batch 100 --key-by-producer-time
run --store "sqlite:$WORK/ptime.db" --ids random --batch 1 --key-by-producer-time
if [ "${STORES:-sqlite postgres}" != sqlite ]; then
"$ROOT/scripts/test-postgres.sh" start "$WORK/pg" "$PG_PORT" >/dev/null
trap '"$ROOT/scripts/test-postgres.sh" stop "$WORK/pg"' EXIT
PG="postgres://postgres@127.0.0.1:$PG_PORT/idem_test"
run --store "$PG" --ids random --batch 100
run --store "$PG" --ids ordered --batch 100
run --store "$PG" --ids random --batch 1 --consumers 1
run --store "$PG" --ids random --batch 1 --consumers 4
"$ROOT/scripts/test-postgres.sh" stop "$WORK/pg"
trap - EXIT
fi
fi

python3 - "$J" "$WORK/ratios.dat" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
with open(sys.argv[2], "w") as f:
    for r in rows:
        label = f'{r["store"]}\\n{r["ids"]} ids\\nbatch {r["batch"]}' + (f'\\n{r["consumers"]} consumers' if r.get("consumers", 1) > 1 else "") + ("\\nproducer-time key" if r.get("key_by_producer_time") else "")
        f.write(f'"{label}" {r["ratio"]:.3f} {r["bare_per_s"]} {r["guarded_per_s"]}\n')
PY
gnuplot <<GP
set terminal png size 1100,560 font ",10"
set bmargin 7
set output "$OUT/marker-ratios-$RETAINED.png"
set title "idem bench marker: bare work / guarded work (lower is better), $RETAINED markers retained"
set style data histograms
set style fill solid 0.8 border -1
set boxwidth 0.7
set ylabel "ratio bare / guarded"
set logscale y 2
set yrange [0.8:*]
set grid ytics
set xtics font ",9"
unset key
plot "$WORK/ratios.dat" using 2:xtic(1) lc rgb "#3a6ea5", "" using 0:2:(sprintf("%.2f", \$2)) with labels offset 0,1 notitle
GP
echo "wrote $OUT/marker-ratios-$RETAINED.png and $J"
