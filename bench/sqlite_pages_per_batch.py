#!/usr/bin/env python3
"""Issue #4: how many pages a batch of 100 time-ordered messages writes to SQLite's WAL,
bare and guarded, for the store's marker layout and for smaller layouts.

With `synchronous=NORMAL` and batches of 100, a commit's cost follows the pages it appends to
the WAL (and that checkpoints later copy back), not the rows. This counts them exactly: each
case builds a fresh file with PRELOAD markers (time-ordered ids, as UUIDv7 outbox ids are), then
commits BATCHES transactions of 100 messages with the WAL never checkpointed, and divides the
WAL's growth by the frame size. The bare side inserts the business row only (the `bench_payments`
row of `idem bench marker`); the guarded side inserts the marker first, as the Inbox does.

    python3 bench/sqlite_pages_per_batch.py          # about 1 minute

Layouts (the store's is the first; the others are what a migration could buy, smallest last):
  store           (consumer TEXT, id BLOB 36 bytes, fingerprint 32 bytes, time) WITHOUT ROWID
  binary_id       the same with the UUID stored as 16 bytes
  compact         consumer as an integer, 16-byte id, 16-byte fingerprint, time, WITHOUT ROWID
  rowid_full      a rowid table keyed by a time-ordered 64-bit integer, every column kept
  rowid_minimal   a rowid table keyed by a time-ordered 64-bit integer, 16-byte id, 8-byte
                  fingerprint, nothing else (a floor: it cannot tell consumers apart)
"""
import hashlib
import os
import random
import sqlite3
import sys
import time
import uuid

PRELOAD = int(os.environ.get("PRELOAD", "200000"))
BATCHES = int(os.environ.get("BATCHES", "300"))
DIR = os.environ.get("WORK", "/tmp/idem-pages")
PAGE = int(os.environ.get("PAGE_SIZE", "4096"))
os.makedirs(DIR, exist_ok=True)

_seq = [0]


def ordered_id():
    """A UUIDv7-like text id: 48-bit milliseconds, then a counter, then random bits."""
    _seq[0] += 1
    ms = int(time.time() * 1000)
    s = _seq[0]
    tail = ((s << 20) | random.getrandbits(20)) & 0xFFFFFFFFFFFF
    return "%012x-7%03x-8%03x-%012x" % (ms, (s >> 24) & 0xFFF, (s >> 12) & 0xFFF, tail)


def now_ms():
    return int(time.time() * 1000)


def fp(i):
    return hashlib.sha256(i.encode()).digest()


def mono_key(_i):
    _seq[0] += 1
    return (now_ms() << 16) | (_seq[0] & 0xFFFF)


WITHOUT_ROWID = "CREATE TABLE m(consumer {c} NOT NULL, id BLOB NOT NULL, fingerprint BLOB NOT NULL, t INTEGER NOT NULL, PRIMARY KEY (consumer, id)) WITHOUT ROWID"
LAYOUTS = [
    ("store", WITHOUT_ROWID.format(c="TEXT"), lambda i: ("bench-ordered", i.encode(), fp(i), now_ms())),
    ("binary_id", WITHOUT_ROWID.format(c="TEXT"), lambda i: ("bench-ordered", uuid.UUID(i).bytes, fp(i), now_ms())),
    ("compact", WITHOUT_ROWID.format(c="INTEGER"), lambda i: (1, uuid.UUID(i).bytes, fp(i)[:16], now_ms())),
    ("rowid_full",
     "CREATE TABLE m(k INTEGER PRIMARY KEY, consumer TEXT NOT NULL, id BLOB NOT NULL, fingerprint BLOB NOT NULL, t INTEGER NOT NULL)",
     lambda i: (mono_key(i), "bench-ordered", i.encode(), fp(i), now_ms())),
    ("rowid_minimal", "CREATE TABLE m(k INTEGER PRIMARY KEY, id BLOB NOT NULL, fingerprint BLOB NOT NULL)",
     lambda i: (mono_key(i), uuid.UUID(i).bytes, fp(i)[:8])),
]


def measure(name, ddl, row):
    path = os.path.join(DIR, name + ".db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    c = sqlite3.connect(path, isolation_level=None)
    c.execute(f"PRAGMA page_size={PAGE}")
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=OFF")  # durability does not change what is written
    c.execute("PRAGMA wal_autocheckpoint=0")
    c.execute("CREATE TABLE bench_payments(message_id TEXT NOT NULL, cents INTEGER NOT NULL)")
    c.execute(ddl)
    width = len(row(ordered_id()))
    ins = "INSERT INTO m VALUES (%s) ON CONFLICT DO NOTHING" % ",".join("?" * width)
    c.execute("BEGIN")
    for _ in range(PRELOAD):
        c.execute(ins, row(ordered_id()))
    c.execute("COMMIT")
    frame = PAGE + 24
    pages = {}
    for side in ("bare", "guarded"):
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        before = os.path.getsize(path + "-wal")
        for _ in range(BATCHES):
            c.execute("BEGIN IMMEDIATE")
            for _ in range(100):
                i = ordered_id()
                if side == "guarded":
                    c.execute(ins, row(i))
                c.execute("INSERT INTO bench_payments VALUES (?, ?)", (i, random.randint(1, 1_000_000)))
            c.execute("COMMIT")
        pages[side] = (os.path.getsize(path + "-wal") - before) / frame / BATCHES
    c.close()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    return pages


def main():
    print(f"SQLite {sqlite3.sqlite_version}, {PAGE}-byte pages, {PRELOAD} markers retained, "
          f"{BATCHES} batches of 100 time-ordered messages per side")
    print("| layout | WAL pages per batch, bare | guarded | guarded/bare |")
    print("|---|---|---|---|")
    for name, ddl, row in LAYOUTS:
        p = measure(name, ddl, row)
        print(f"| {name} | {p['bare']:.2f} | {p['guarded']:.2f} | {p['guarded'] / p['bare']:.2f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
