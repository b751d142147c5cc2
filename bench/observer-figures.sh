#!/usr/bin/env bash
# The observer's figures in doc/performance.md ("Seeing what it does"): the
# Inbox without an observer, with idem::Metrics, and with Metrics plus the
# live view's feed read by one page, in alternating rounds on one SQLite
# store, per message and in batches of 100; then the live view in headless
# Chromium with 1,000 messages a second flowing (the browser test's
# measuring case). Logs in bench/results/observer-*.log.
# Usage: ./run build && bench/observer-figures.sh   (ROUNDS=7 SECONDS_PER_ROUND=2, ~2 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
IDEM=${IDEM:-build/tools/idem/idem}
ROUNDS=${ROUNDS:-7}
SECS=${SECONDS_PER_ROUND:-2}
OUT=bench/results
DIR=$(mktemp -d /tmp/idem-observer-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
for batch in 1 100; do
  "$IDEM" bench observer --store "sqlite:$DIR/b$batch.db" --batch "$batch" --seconds "$SECS" --rounds "$ROUNDS" \
    2>/dev/null | tee "$OUT/observer-sqlite-batch$batch.log"
done
# The page at 1,000 msg/s: its figures line (live-view: ...), from the test.
(cd build && IDEM_LIVE_SCREENSHOTS="$DIR" ctest -R 'web.LiveViewTest.AThousand' -V 2>&1) |
  grep -E 'live-view:|Passed|Failed' | tee "$OUT/observer-live-view-1000.log"
