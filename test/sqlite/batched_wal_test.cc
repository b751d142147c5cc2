// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The batched-WAL shim (src/sqlite/batched_wal.h): with synchronous=FULL a
// commit's WAL frames reach the file in one write; every commit is seen at
// once by other connections; a gathered write that fails fails its commit
// and loses nothing that was committed; NORMAL, and batch_wal=off, write as
// SQLite does.
#include "sqlite_driver/batched_wal.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "idem/sqlite/store.h"
#include "idem/testing/fault_vfs.h"
#include "util/fault_vfs_util.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using sqlite_driver::BatchedWalCounts;

std::unique_ptr<Store> OpenStore(const std::string& url) {
  auto o = sqlite::Store::ParseUrl(url);
  EXPECT_OK(o);
  if (!o.ok()) return nullptr;
  auto s = sqlite::Store::Open(*o);
  EXPECT_OK(s);
  return s.ok() ? std::move(*s) : nullptr;
}

Status CreateRows(Store& store) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_RETURN_IF_ERROR(tx->Exec("CREATE TABLE IF NOT EXISTS t(k INTEGER PRIMARY KEY, v BLOB NOT NULL)", {}).status());
  return tx->Commit();
}

// One transaction of `n` rows of 1 KiB (about n / 4 pages).
Status InsertRows(Store& store, int from, int n) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  for (int i = from; i < from + n; ++i) {
    Value row[] = {int64_t{i}, std::string(1024, static_cast<char>('a' + i % 26))};
    IDEM_RETURN_IF_ERROR(tx->Exec("INSERT INTO t(k, v) VALUES ($1, $2)", row).status());
  }
  return tx->Commit();
}

int64_t Rows(Store& store) {
  auto tx = store.Begin();
  if (!tx.ok()) return -1;
  auto r = (*tx)->Query("SELECT count(*) FROM t");
  return r.ok() ? r->rows[0][0].AsInt() : -1;
}

// The WAL writes SQLite made and those that reached the file, for one commit.
struct Writes {
  uint64_t made = 0, written = 0;
};
Writes CommitOf(Store& store, int from, int n) {
  const auto before = BatchedWalCounts();
  EXPECT_TRUE(InsertRows(store, from, n).ok());
  const auto after = BatchedWalCounts();
  return {after.wal_writes_in - before.wal_writes_in, after.wal_writes_out - before.wal_writes_out};
}

TEST(BatchedWal, WithFullACommitsFramesReachTheFileInOneWrite) {
  TempDir dir;
  auto store = OpenStore("sqlite:" + dir.File("full.db") + "?synchronous=full");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(CreateRows(*store).ok());
  // Two writes per frame (its header, its page) for 3 or 4 pages: one write.
  const Writes small = CommitOf(*store, 0, 12);
  EXPECT_GE(small.made, 6u);
  EXPECT_EQ(small.written, 1u) << "made " << small.made;
  // About 330 pages (1.4 MiB): pieces of 64 KiB, so about 22 writes. (One
  // write of it all would be cut short by the unix VFS, which takes lengths
  // modulo 128 KiB, and fail the commit SQLITE_FULL.)
  const Writes large = CommitOf(*store, 12, 1000);
  EXPECT_GE(large.made, 600u);
  EXPECT_GE(large.written, large.made * 4120 / 2 / (64 * 1024)) << "made " << large.made;
  EXPECT_LE(large.written, large.made / 20) << "made " << large.made;
  EXPECT_EQ(Rows(*store), 1012);
  EXPECT_EQ(IntegrityCheck(*store), "ok");
}

TEST(BatchedWal, NormalAndBatchWalOffWriteEveryFrameAsSqliteDoes) {
  for (const char* opts : {"?synchronous=normal", "?synchronous=full&batch_wal=off"}) {
    SCOPED_TRACE(opts);
    TempDir dir;
    auto store = OpenStore("sqlite:" + dir.File("s.db") + opts);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(CreateRows(*store).ok());
    const Writes w = CommitOf(*store, 0, 200);
    // Not through the shim at all: it counts nothing.
    EXPECT_EQ(w.made, 0u);
    EXPECT_EQ(w.written, 0u);
    EXPECT_EQ(Rows(*store), 200);
  }
}

// Another store on the same file (its own connections) sees each commit as
// soon as it returns: the gathered frames are in the file before the
// wal-index says they are committed.
TEST(BatchedWal, EveryCommitIsSeenAtOnceByAnotherConnection) {
  TempDir dir;
  const std::string url = "sqlite:" + dir.File("seen.db") + "?synchronous=full";
  auto writer = OpenStore(url);
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(CreateRows(*writer).ok());
  auto reader = OpenStore(url);
  ASSERT_NE(reader, nullptr);
  int total = 0;
  for (int i = 0; i < 100; ++i) {
    const int n = 1 + (i * 7) % 40;  // 1 to 40 rows: one page to ten
    ASSERT_TRUE(InsertRows(*writer, total, n).ok());
    total += n;
    ASSERT_EQ(Rows(*reader), total) << "commit " << i;
  }
}

// Through the fault VFS: the gathered write fails (the first WAL write the
// fault VFS sees after arming), so the commit fails and is not there after a
// reopen; the commits before it are; the next commit works.
TEST(BatchedWal, AGatheredWriteThatFailsFailsItsCommitAndLosesNoEarlierOne) {
  ASSERT_TRUE(Vfs().Reset().ok());
  TempDir dir;
  const std::string url =
      "sqlite:" + dir.File("fail.db") + "?synchronous=full&vfs=" + std::string(sqlite::FaultVfs::kName);
  {
    auto store = OpenStore(url);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(CreateRows(*store).ok());
    ASSERT_TRUE(InsertRows(*store, 0, 10).ok());
    Vfs().Arm({.action = sqlite::FaultVfs::Action::kIoError,
               .op = sqlite::FaultVfs::Op::kWrite,
               .file = sqlite::FaultVfs::FileKind::kWal,
               .at = 1});
    const Status failed = InsertRows(*store, 10, 40);
    EXPECT_FALSE(failed.ok());
    Vfs().Disarm();
  }
  auto store = OpenStore(url);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(Rows(*store), 10);
  EXPECT_EQ(IntegrityCheck(*store), "ok");
  ASSERT_TRUE(InsertRows(*store, 10, 40).ok());
  EXPECT_EQ(Rows(*store), 50);
  store.reset();
  ASSERT_TRUE(Vfs().Reset().ok());
}

}  // namespace
}  // namespace idem::testing
