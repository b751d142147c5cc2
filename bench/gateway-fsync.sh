#!/usr/bin/env bash
# How long the gateway's commits wait for the disk: `idem bench gateway` on a
# SQLite file in a temporary directory (synchronous FULL) under strace, which
# stops the process only at openat and fdatasync (seccomp), and the
# distribution of the fdatasync calls on the store's WAL (doc/performance.md,
# "The gateway"), after the same disk's fdatasync alone. A first execution
# waits for two of them (its claim, then its answer), one after the other.
#   bench/gateway-fsync.sh [FLAGS of idem bench gateway...]   # default --rounds 2
# Environment: IDEM (default build/tools/idem/idem).
set -euo pipefail
cd "$(dirname "$0")/.."
IDEM=${IDEM:-build/tools/idem/idem}
command -v strace >/dev/null || { echo "gateway-fsync: needs strace (apt-get install strace)" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
[ $# -gt 0 ] || set -- --rounds 2
# The disk alone first, in the same directory: a WAL-frame-sized append
# then its fdatasync, back to back (as under load) and then with a pause
# between them (spinning: the CPU stays awake), as commits come when the
# store has other work between them (a lone client's: its upstream's 5 ms).
python3 - "$dir/probe" <<'PY'
import os, sys, time
for gap_us in (0, 100, 200, 400, 1000, 5000):
    fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    ms, off = [], 0
    for i in range(300):
        os.pwrite(fd, b"y" * 4120, off)
        off += 4120
        t = time.perf_counter_ns()
        os.fdatasync(fd)
        ms.append((time.perf_counter_ns() - t) / 1e6)
        until = time.perf_counter_ns() + gap_us * 1000
        while time.perf_counter_ns() < until:
            pass
    os.close(fd)
    ms.sort()
    n = len(ms)
    print("disk alone, fdatasync after a 4 KiB append, %5d us after the last: p50 %.3f ms, p90 %.3f, mean %.3f"
          % (gap_us, ms[n // 2], ms[int(n * 0.9)], sum(ms) / n))
PY
strace -f --seccomp-bpf -e trace=openat,fdatasync -T -o "$dir/trace" \
  "$IDEM" bench gateway --store "sqlite:$dir/g.db" "$@" >"$dir/out" 2>&1 || { cat "$dir/out" >&2; exit 1; }
grep -E "gateway/direct, first|^  gateway_first +mean" "$dir/out"
python3 - "$dir/trace" <<'PY'
import re, sys
wal, ms = set(), []
for line in open(sys.argv[1]):
    m = re.match(r'\d+\s+openat\(.*-wal".*= (\d+)', line)
    if m:
        wal.add(int(m.group(1)))
        continue
    m = re.match(r'\d+\s+fdatasync\((\d+)\).*<([0-9.]+)>', line)
    if m and int(m.group(1)) in wal:
        ms.append(float(m.group(2)) * 1e3)
ms.sort()
n = len(ms)
if n == 0:
    sys.exit("gateway-fsync: no fdatasync on the WAL was traced")
print("WAL fdatasync under strace: %d calls, p50 %.3f ms, p90 %.3f, p99 %.3f, mean %.3f"
      % (n, ms[n // 2], ms[int(n * 0.9)], ms[int(n * 0.99)], sum(ms) / n))
PY
