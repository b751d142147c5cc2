#!/usr/bin/env bash
# Runs the peer baselines of ../shared/peers with idem added to the same
# round, so every comparison is measured side by side. It copies the peers to a
# temporary directory (shared/ is read-only), adds an "idem" peer whose run.sh
# calls `idem bench peers` (same workload, same result line), inserts it into
# run-all.sh right after the hand-written baseline, and runs the round.
#   bench/peers/run-with-idem.sh                  # RUNS=3, N=20000: ~15 minutes
#   RUNS=1 N=2000 bench/peers/run-with-idem.sh    # smoke
# Needs node/npm (the peers' npm ci), redis-server and wrk, as the peers' README says.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
IDEM=${IDEM:-$ROOT/build/tools/idem/idem}
PEERS=${PEERS:-$ROOT/../shared/peers}
[ -x "$IDEM" ] || { echo "build idem first (./run build): $IDEM" >&2; exit 2; }
[ -d "$PEERS" ] || { echo "no peers at $PEERS" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-peers.XXXXXX")
cp -r "$PEERS" "$work/"
P=$work/peers
chmod -R u+w "$P"
mkdir -p "$P/idem"
cat >"$P/idem/run.sh" <<RUN
#!/usr/bin/env bash
# idem on the peers' workload: one transaction per delivery (BATCH=1) or per
# BATCH deliveries, marker and payment row committed together, fsync on.
set -euo pipefail
PEERS_DIR=\$(cd "\$(dirname "\$0")/.." && pwd)
started=0
if ! "\$PEERS_DIR/services.sh" status | grep -q '^postgres: running'; then "\$PEERS_DIR/services.sh" start; started=1; fi
trap '[ \$started = 1 ] && "\$PEERS_DIR/services.sh" stop' EXIT
eval "\$("\$PEERS_DIR/services.sh" env)"
for i in \$(seq "\${RUNS:-1}"); do "$IDEM" bench peers --batch "\${BATCH:-1}"; done
RUN
chmod +x "$P/idem/run.sh"
# Run idem right after the baseline, in both of its forms.
sed -i 's|^run baseline-node-pg                    baseline-node-pg$|&\nrun idem                                idem BATCH=1\nrun idem-batch16                        idem BATCH=16|' "$P/run-all.sh"
grep -q '^run idem ' "$P/run-all.sh" || { echo "could not add idem to run-all.sh" >&2; exit 3; }
cd "$P"
./run-all.sh
echo "(peers copy: $P)"
