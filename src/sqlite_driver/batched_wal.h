// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: a SQLite VFS shim that writes a commit's WAL frames in one write.
//
// SQLite appends each frame of a commit to the WAL with two writes (its
// 24-byte header, then the page), so a group commit of 15 pages makes 30
// pwrite calls before its sync. Through this shim, while a thread is inside
// a BatchedWalWrites scope (the store's COMMIT), a WAL file's consecutive
// writes are gathered in memory and written as one (in pieces of 64 KiB:
// SQLite's unix VFS cannot take 128 KiB at once), before anything can depend
// on them:
//   - before any other operation on that WAL file (its sync, a read, ...);
//   - before the connection touches the wal-index (the database file's shm
//     lock, map or barrier): a commit becomes visible to other connections
//     only when the wal-index header is written after a barrier, so no
//     reader can see a frame before its bytes are in the file;
//   - when the scope ends.
// Only for synchronous=FULL (or EXTRA), where the commit syncs the WAL (and
// so writes the gathered frames and learns of any error) before it makes the
// commit visible. A crash loses only frames not yet written, which no commit
// had made visible or durable: as a crash before those writes.
#ifndef IDEM_SRC_SQLITE_DRIVER_BATCHED_WAL_H_
#define IDEM_SRC_SQLITE_DRIVER_BATCHED_WAL_H_

#include <string>

#include "idem/result.h"

namespace idem::sqlite_driver {

// The name of the shim over the VFS `base` ("" for the default one),
// registered on first use.
Result<std::string> BatchedWalVfs(const std::string& base);

// While one lives on a thread (and `on`), WAL writes of files opened through
// the shim are gathered; it writes what is left when it ends.
class BatchedWalWrites {
 public:
  explicit BatchedWalWrites(bool on);
  ~BatchedWalWrites();
  BatchedWalWrites(const BatchedWalWrites&) = delete;
  BatchedWalWrites& operator=(const BatchedWalWrites&) = delete;

 private:
  bool on_;
};

// How many gathered writes went to the file (tests): the shim's calls to
// the underlying VFS's xWrite for WAL files, and the writes SQLite made.
struct BatchedWalStats {
  uint64_t wal_writes_in = 0, wal_writes_out = 0;
};
BatchedWalStats BatchedWalCounts();

}  // namespace idem::sqlite_driver

#endif  // IDEM_SRC_SQLITE_DRIVER_BATCHED_WAL_H_
