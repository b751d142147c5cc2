// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The SQLite store: markers and business data in one SQLite file, one local
// transaction for both. WAL mode; write transactions begin with BEGIN
// IMMEDIATE so that two processes on one file are serialised by SQLite's
// lock (waiting up to busy_timeout_ms) instead of failing at commit.
//
// Thread safety: the Store is safe from many threads; each transaction gets
// its own connection from a small pool.
#ifndef IDEM_SQLITE_STORE_H_
#define IDEM_SQLITE_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/env.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem::sqlite {

enum class Synchronous {
  kOff,     // no fsync: an OS crash may lose or corrupt recent commits
  kNormal,  // WAL fsynced at checkpoints only: an OS crash or power cut may
            // lose the last commits (never corrupts); a process crash loses nothing
  kFull,    // fsync at every commit: a commit that returned survives power loss
};

// Where checkpoints run: see Options::checkpoint.
enum class Checkpoint { kAuto, kBackground, kInline };

// Opens SQLite stores. What Open returns is an idem::Store (idem/store.h),
// the type users hold.
class Store {
 public:
  struct Options {
    // The database file. Its directory must exist. Required (no default).
    std::string path{};
    // Durability of each commit. Default: kFull, so an acknowledgement sent
    // after commit never refers to a commit that a power cut can undo.
    Synchronous synchronous = Synchronous::kFull;
    // How long a writer waits for another connection's or process's lock before
    // giving Code::kBusy. 0..3,600,000. Default: 10 s.
    int busy_timeout_ms = 10'000;
    // Page cache per connection, in KiB. Each pooled connection has its own;
    // the markers stay on disk (and in the OS page cache), not here.
    // 0..64 GiB. Default: 16 MiB.
    int cache_kib = 16 * 1024;
    // Pages the WAL may hold before a commit copies them back into the
    // database file (a checkpoint). Larger: fewer, longer checkpoints and a
    // larger -wal file (pages x page size). 0 (never) .. 2^30. Default: 10000.
    // URL: ?wal_autocheckpoint_pages=N (or ?wal_autocheckpoint=N).
    int wal_autocheckpoint_pages = 10'000;
    // Where checkpoints (copying the WAL back into the database file) run.
    // kBackground: on a thread of the store's own, woken by the commits that
    // find the WAL past wal_autocheckpoint_pages, so no commit waits for one;
    // should it fall behind to 8x that, the committing thread checkpoints
    // itself, so the WAL stays bounded (it may reach 8x wal_autocheckpoint_pages
    // pages). kInline: SQLite's own autocheckpoint, in the commit that fills
    // the WAL. kAuto (default): kBackground with synchronous NORMAL or OFF
    // (measured 1.8x faster guarded batches with random ids), kInline with
    // FULL (whose commits would wait behind the checkpoints' syncs).
    // URL: ?checkpoint=auto|background|inline.
    Checkpoint checkpoint = Checkpoint::kAuto;
    // Page size of a NEW database file, in bytes (512..65536, a power of two);
    // an existing file keeps its own. Random marker keys dirty one page each
    // per commit, so smaller pages mean fewer bytes written. Default: 4096.
    // Checked at Open.
    int page_size = 4096;
    // Create the file and idem's tables when missing. Default: true. When
    // false, a file without idem's schema is an error. URL:
    // ?create_if_missing=true|false.
    bool create_if_missing = true;
    // The clock of the store's records and waits. Default (nullptr):
    // Env::Default().
    Env* env = nullptr;
    // The SQLite VFS (the layer under SQLite that does the file I/O) to open
    // the file through, by the name it was registered with
    // (sqlite3_vfs_register). "idem-fault" is the fault injection VFS of tests
    // and `idem chaos` (idem/testing/fault_vfs.h: FaultVfs::Install()
    // registers it), never for production. Default: empty, SQLite's default
    // VFS.
    std::string vfs{};
    // With synchronous FULL: a commit's WAL frames go to the file in one write
    // instead of two per page (its header, then the page), through a thin VFS
    // layer over `vfs` (src/sqlite_driver/batched_wal.h says when the gathered bytes
    // are written: always before the commit is synced or made visible). No
    // effect with NORMAL or OFF. Default: true.
    // URL: ?batch_wal_writes=true|false (or ?batch_wal=on|off).
    bool batch_wal_writes = true;
  };

  // Checks the options, then opens (and creates or migrates) the store.
  // Errors: kInvalidArgument (empty path, an in-memory path, a bad
  // page_size or number, a VFS name that is not registered), kUnavailable
  // (missing directory, unreadable file, locked too long), kCorruption (not
  // a SQLite database), kSchemaMismatch (a newer schema).
  static Result<std::unique_ptr<idem::Store>> Open(const Options& options);

  // Parses "sqlite:PATH", "sqlite://PATH" or a bare PATH (by idem/url.h's
  // file form) into options. Query keys are the fields' names:
  // synchronous=full|normal|off, busy_timeout_ms, cache_kib,
  // wal_autocheckpoint_pages, checkpoint=auto|background|inline, page_size,
  // create_if_missing, vfs=NAME, batch_wal_writes (whether the VFS exists is
  // checked at Open). An unknown key: kInvalidArgument naming it.
  static Result<Options> ParseUrl(std::string_view url);

  // Whether a store opened with `options` checkpoints on its own thread
  // (Options::checkpoint, resolving kAuto by the synchronous setting).
  static bool CheckpointsInBackground(const Options& options);

  Store() = delete;
};

}  // namespace idem::sqlite

#endif  // IDEM_SQLITE_STORE_H_
