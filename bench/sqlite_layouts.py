#!/usr/bin/env python3
"""Exploration for issue #4: candidate SQLite marker layouts and settings, side by side.

Each case builds a fresh file with N retained markers (inserted sorted, so pages are packed),
then times 300 transactions of 100 random-id marker inserts (synchronous=NORMAL, BEGIN
IMMEDIATE), as the guarded side of `idem bench marker --batch 100` does. The bare case is the
business insert alone. Python's sqlite3 module on the system's SQLite; the per-row Python
overhead is the same for every case, so compare the rates with each other.

    python3 bench/sqlite_layouts.py 1000000      # about 3 minutes
    python3 bench/sqlite_layouts.py 10000000     # about 20 minutes
"""
import os
import sqlite3
import sys
import time
import uuid

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
DIR = os.environ.get("WORK", "/tmp/idem-layouts")
os.makedirs(DIR, exist_ok=True)
now = [1_700_000_000_000]


def ts():
    now[0] += 1
    return now[0]


def case(name, ddl, row, insert, page_size=4096, cache_kib=8192, autocheckpoint=1000):
    path = os.path.join(DIR, "layout.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    c = sqlite3.connect(path, isolation_level=None)
    c.execute(f"PRAGMA page_size={page_size}")
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=OFF")
    c.execute("PRAGMA cache_size=-262144")
    for s in ddl:
        c.execute(s)
    rows = sorted(row() for _ in range(N))
    c.execute("BEGIN")
    c.executemany(insert, rows)
    c.execute("COMMIT")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA synchronous=NORMAL")
    c.execute(f"PRAGMA cache_size=-{cache_kib}")
    c.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint}")
    batches = [[row() for _ in range(100)] for _ in range(300)]
    t0 = time.time()
    for b in batches:
        c.execute("BEGIN IMMEDIATE")
        c.executemany(insert, b)
        c.execute("COMMIT")
    rate = 30000 / (time.time() - t0)
    print(f"{name:58s} {rate:10.0f} inserts/s", flush=True)
    c.close()


CONSUMER = "payments"
current = ["CREATE TABLE m(consumer TEXT NOT NULL, id BLOB NOT NULL, fp BLOB NOT NULL, ts INTEGER NOT NULL,"
           " PRIMARY KEY(consumer, id)) WITHOUT ROWID", "CREATE INDEX m_ts ON m(ts)"]
current_row = lambda: (CONSUMER, str(uuid.uuid4()).encode(), os.urandom(32), ts())
current_ins = "INSERT INTO m VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
hashed = ["CREATE TABLE m(k BLOB PRIMARY KEY, fp BLOB NOT NULL, ts INTEGER NOT NULL) WITHOUT ROWID"]
hashed_ins = "INSERT INTO m VALUES (?, ?, ?) ON CONFLICT DO NOTHING"

print(f"{N} markers retained, random ids, batches of 100, synchronous=NORMAL")
case("bare: business row only (rowid table)", ["CREATE TABLE m(message_id TEXT, cents INTEGER)"],
     lambda: (str(uuid.uuid4()), 4000), "INSERT INTO m VALUES (?, ?)")
case("v1 layout, 4 KiB pages, 8 MiB cache, checkpoint 1000", current, current_row, current_ins)
case("v1 layout, 4 KiB pages, 16 MiB cache, checkpoint 10000", current, current_row, current_ins,
     cache_kib=16384, autocheckpoint=10000)
case("v1 layout, 2 KiB pages, 16 MiB cache, checkpoint 20000", current, current_row, current_ins,
     page_size=2048, cache_kib=16384, autocheckpoint=20000)
case("16-byte hash key + 32-byte fp + seq, 2 KiB, 16 MiB, 20000", hashed,
     lambda: (os.urandom(16), os.urandom(32), ts()), hashed_ins, page_size=2048, cache_kib=16384,
     autocheckpoint=20000)
case("16-byte hash key + 8-byte fp + seq, 2 KiB, 16 MiB, 20000", hashed,
     lambda: (os.urandom(16), os.urandom(8), ts()), hashed_ins, page_size=2048, cache_kib=16384,
     autocheckpoint=20000)
case("v1 layout, time-ordered ids (locality), 4 KiB, 16 MiB, 10000", current,
     lambda: (CONSUMER, f"{ts():016x}-{os.urandom(8).hex()}".encode(), os.urandom(32), now[0]), current_ins,
     cache_kib=16384, autocheckpoint=10000)
