#!/usr/bin/env bash
# Ratios of an http-vs-express.sh run (its output on stdin or in the files
# given): for every idem mode and phase, requests/s against express's in the
# same round, the median over the rounds, the replay p99s, and any bad
# answers. bench/peers/http-vs-express.sh prints it at its end.
#   bench/peers/http-summary.sh bench/results/http-vs-express-20261130-round9.log [more logs]
set -euo pipefail
cat "$@" | awk '
  /^== round/ { round++ }
  /^peer=/ {
    for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = substr($i, length(kv[1]) + 2) }
    key = f["peer"] " " f["phase"]
    rate[key, round] = f["requests_per_s"]; p99[key, round] = f["p99_ms"]; bad[key, round] = f["bad"]
    if (!(key in seen)) { seen[key] = 1; order[++n] = key }
  }
  function median(a, m,   i, j, t) {
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    printf "%-42s %-7s %-52s %-8s %s\n", "side", "phase", "vs express per round", "median", "p99 ms per round"
    for (k = 1; k <= n; k++) {
      key = order[k]; split(key, parts, " ")
      if (parts[1] == "express-idempotency") continue
      peer = "express-idempotency " parts[2]
      m = 0; line = ""; lat = ""; worst = ""
      for (r = 1; r <= round; r++) {
        if (!((key, r) in rate) || !((peer, r) in rate)) continue
        x[++m] = rate[key, r] / rate[peer, r]
        line = line sprintf("%s%.2fx", m > 1 ? " / " : "", x[m])
        lat = lat sprintf("%s%s", m > 1 ? " / " : "", p99[key, r])
        if (bad[key, r] != "0+0") worst = worst " bad(round " r ")=" bad[key, r]
      }
      if (m == 0) continue
      printf "%-42s %-7s %-52s %-8s %s%s\n", parts[1], parts[2], line, sprintf("%.2fx", median(x, m)), lat, worst
    }
  }'
