#!/usr/bin/env python3
"""Plots idem beside pgbench on PostgreSQL (doc/performance.md, "PostgreSQL
beside its floor") from bench/pg/floor.sh's logs: for each path the rate
pgbench reaches with idem's statements over idem's own rate, median of the
rounds with the lowest and highest as error bars (1 = idem at the floor).

  python3 bench/pg/floor-plot.py [RESULTS_DIR] [DATE]     # needs gnuplot
writes RESULTS_DIR/pg-floor.png (and pg-floor.dat)."""
import os
import re
import statistics
import subprocess
import sys

results = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "results")
date = sys.argv[2] if len(sys.argv) > 2 else "2026-12-04"


def rounds(name):
    """Each '# command' header and the rounds' fields under it."""
    groups, current = [], None
    with open(os.path.join(results, f"pg-floor-{name}-{date}.log")) as f:
        for line in f:
            if line.startswith("#") or line.startswith("$"):
                current = (line.strip(), [])
                groups.append(current)
            elif line.startswith("round="):
                if current is None:
                    current = ("", [])
                    groups.append(current)
                current[1].append({k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", line)})
    return [g for g in groups if g[1]]


bars = []  # (label, [pgbench / idem per round])
for _, rs in rounds("inbox"):
    bars.append(("inbox, 4 consumers", [r["pgbench_guarded_per_s"] / r["idem_guarded_per_s"] for r in rs]))
for header, rs in rounds("http-pipelined"):
    # "# [FIBERS=F] bench/pg/floor.sh http $PG COMMITTERS ROUNDS N GROUP"
    args = header.split("http", 1)[1].split()
    committers, group = int(args[1]), int(args[4])
    label = (f"HTTP, group commit,\\n{committers} committer{'s' if committers > 1 else ''}" if group > 0
             else "HTTP, a transaction\\nper request")
    bars.append((label, [r["pgbench_over_idem"] for r in rs]))
for _, rs in rounds("relay"):
    bars.append(("outbox relay,\\nstore side", [r["pgbench_over_idem_store"] for r in rs]))
for _, rs in rounds("claims"):
    bars.append(("claims,\\n16 threads", [r["pgbench_over_idem"] for r in rs]))

dat = os.path.join(results, "pg-floor.dat")
with open(dat, "w") as f:
    for i, (label, v) in enumerate(bars):
        f.write(f'{i} "{label}" {statistics.median(v):.3f} {min(v):.3f} {max(v):.3f}\n')
png = os.path.join(results, "pg-floor.png")
script = f"""
set terminal png size 1000,540 font ",10"
set bmargin 5
set output "{png}"
set title "PostgreSQL 15, fsync on, 2 cores: pgbench with idem's statements / idem (1 = at the floor)"
set style fill solid 0.6
set boxwidth 0.6
set yrange [0:2.2]
set grid ytics
set ylabel "pgbench rate / idem rate (median, min-max of rounds)"
set xtics nomirror
unset key
plot "{dat}" using 1:3:xtic(2) with boxes lc rgb "#4477aa", \\
     "" using 1:3:4:5 with yerrorbars lc rgb "black" pt 7 ps 0.5, \\
     1 with lines lc rgb "#cc3311" dt 2
"""
subprocess.run(["gnuplot"], input=script.encode(), check=True)
print(f"wrote {png}")
