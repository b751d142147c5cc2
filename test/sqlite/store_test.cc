// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// What only the SQLite store has: files, locks, processes sharing one file,
// the error translation table.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <thread>

#include "idem/claims.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "idem/testing/kill_points.h"
#include "sql/sql_store.h"
#include "sqlite_driver/db.h"
#include "util/claims_conformance.h"
#include "util/outbox_conformance.h"
#include "util/sqlite_claim_flights.h"
#include "util/store_conformance.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

// The multi-row form of an InsertLater statement: tuples numbered on, the
// text around the tuple kept, parameters in quoted text left alone.
TEST(MultiRowInsert, NumbersEachTupleOnAndKeepsTheRest) {
  using sql_internal::MultiRowInsert;
  auto two = MultiRowInsert("INSERT INTO t(a, b) VALUES ($1, lower($2)) ON CONFLICT DO NOTHING", 2, 3);
  ASSERT_OK(two);
  EXPECT_EQ(*two,
            "INSERT INTO t(a, b) VALUES ($1, lower($2)), ($3, lower($4)), ($5, lower($6)) ON CONFLICT DO NOTHING");
  auto quoted = MultiRowInsert("insert into t values ($2, '($1)', $1)", 2, 2);
  ASSERT_OK(quoted);
  EXPECT_EQ(*quoted, "insert into t values ($2, '($1)', $1), ($4, '($1)', $3)");
  EXPECT_FALSE(MultiRowInsert("UPDATE t SET a = $1", 1, 2).ok());
  EXPECT_FALSE(MultiRowInsert("INSERT INTO t SELECT $1", 1, 2).ok());
  EXPECT_FALSE(MultiRowInsert("INSERT INTO t VALUES ($1, $3)", 2, 2).ok());
  EXPECT_FALSE(MultiRowInsert("INSERT INTO t VALUES ($1) RETURNING a", 1, 2).ok());
  EXPECT_FALSE(MultiRowInsert("INSERT INTO t VALUES ($1", 1, 2).ok());
}

TEST(SqliteErrors, TranslationTable) {
  using sqlite_driver::CodeFor;
  struct Row {
    int rc;
    Code code;
  } rows[] = {
      {SQLITE_OK, Code::kOk},
      {SQLITE_BUSY, Code::kBusy},
      {SQLITE_BUSY_SNAPSHOT, Code::kBusy},
      {SQLITE_LOCKED, Code::kBusy},
      {SQLITE_CONSTRAINT_PRIMARYKEY, Code::kDuplicate},
      {SQLITE_CONSTRAINT_UNIQUE, Code::kDuplicate},
      {SQLITE_CONSTRAINT_NOTNULL, Code::kInvalidArgument},
      {SQLITE_CORRUPT, Code::kCorruption},
      {SQLITE_NOTADB, Code::kCorruption},
      {SQLITE_CANTOPEN, Code::kUnavailable},
      {SQLITE_READONLY, Code::kUnavailable},
      {SQLITE_IOERR_FSYNC, Code::kIoError},
      {SQLITE_FULL, Code::kIoError},
      {SQLITE_ERROR, Code::kInvalidArgument},
      {SQLITE_INTERRUPT, Code::kAborted},
      {SQLITE_NOMEM, Code::kRetryable},
      {SQLITE_MISUSE, Code::kInternal},
  };
  for (const Row& r : rows) EXPECT_EQ(CodeFor(r.rc), r.code) << "rc " << r.rc;
  Status s = sqlite_driver::Translate(SQLITE_BUSY, nullptr, "COMMIT");
  EXPECT_EQ(s.code(), Code::kBusy);
  EXPECT_NE(s.message().find("COMMIT"), std::string::npos);
  EXPECT_TRUE(sqlite_driver::Translate(SQLITE_DONE, nullptr, "x").ok());
}

TEST(SqliteErrors, ParametersAreRewrittenOutsideQuotes) {
  using sqlite_driver::RewriteParams;
  EXPECT_EQ(RewriteParams("SELECT $1, $2 FROM t WHERE a = '$3' AND \"$4\" = $10"),
            "SELECT ?1, ?2 FROM t WHERE a = '$3' AND \"$4\" = ?10");
  EXPECT_EQ(RewriteParams("SELECT $a"), "SELECT $a");
}

// The writers of one file in one process are served in the order they
// came (sqlite_driver::WriteGate), and a waiter that gave up is skipped.
TEST(SqliteWriteGate, ServesWritersInTheOrderTheyCame) {
  auto gate = sqlite_driver::WriteGate::For("/gate-test/order.db");
  ASSERT_TRUE(gate->Acquire(1'000));
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&, i] {
      ASSERT_TRUE(gate->Acquire(60'000));
      {
        std::lock_guard<std::mutex> l(mu);
        order.push_back(i);
      }
      gate->Release();
    });
    ASSERT_TRUE(WaitFor([&] { return gate->Waiting() == static_cast<size_t>(i + 1); }));
  }
  gate->Release();
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(gate->Waiting(), 0u);
}

TEST(SqliteWriteGate, AWaiterThatGaveUpIsSkipped) {
  auto gate = sqlite_driver::WriteGate::For("/gate-test/skip.db");
  ASSERT_TRUE(gate->Acquire(1'000));
  EXPECT_FALSE(gate->Acquire(1));  // gives up: the holder holds on
  std::atomic<bool> got{false};
  std::thread next([&] {
    got = gate->Acquire(60'000);
    gate->Release();
  });
  ASSERT_TRUE(WaitFor([&] { return gate->Waiting() == 1; }));
  gate->Release();  // to the waiter after the one that gave up
  next.join();
  EXPECT_TRUE(got);
  ASSERT_TRUE(gate->Acquire(1'000));
  gate->Release();
}

// A writer that commits back to back on one connection does not keep
// another connection of the process out: once that one waits, it is next.
TEST(SqliteWriteGate, AWriterCommittingBackToBackLetsAWaitingOneIn) {
  TempDir dir;
  const std::string path = dir.File("gate.db");
  auto a = sqlite_driver::Db::Open({.path = path});
  ASSERT_OK(a);
  ASSERT_TRUE((*a)->Script("CREATE TABLE t(x INTEGER)").ok());
  auto b = sqlite_driver::Db::Open({.path = path});
  ASSERT_OK(b);
  auto gate = sqlite_driver::WriteGate::For(std::filesystem::weakly_canonical(path).string());
  std::atomic<int64_t> commits{0};
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop) {
      ASSERT_TRUE((*a)->Exec("BEGIN IMMEDIATE", {}).ok());
      ASSERT_TRUE((*a)->Exec("INSERT INTO t VALUES (1)", {}).ok());
      ASSERT_TRUE((*a)->Exec("COMMIT", {}).ok());
      ++commits;
    }
  });
  ASSERT_TRUE(WaitFor([&] { return commits >= 100; }));
  int64_t queued_at = -1;
  std::thread watcher([&] {
    ASSERT_TRUE(WaitFor([&] { return gate->Waiting() >= 1; }, 60'000));
    queued_at = commits.load();
  });
  ASSERT_TRUE((*b)->Exec("BEGIN IMMEDIATE", {}).ok());
  const int64_t in_at = commits.load();
  watcher.join();
  ASSERT_TRUE((*b)->Exec("INSERT INTO t VALUES (2)", {}).ok());
  ASSERT_TRUE((*b)->Exec("COMMIT", {}).ok());
  stop = true;
  busy.join();
  // Queued behind the transaction that held the gate, and no other.
  EXPECT_LE(in_at - queued_at, 1) << "commits of the busy writer while the other waited";
}

TEST(SqliteStore, UrlParsing) {
  auto o = sqlite::Store::ParseUrl("sqlite:/tmp/x.db?synchronous=normal");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->path, "/tmp/x.db");
  EXPECT_EQ(o->synchronous, sqlite::Synchronous::kNormal);
  EXPECT_EQ(sqlite::Store::ParseUrl("sqlite:///tmp/y.db")->path, "/tmp/y.db");
  EXPECT_EQ(sqlite::Store::ParseUrl("plain.db")->path, "plain.db");
  EXPECT_EQ(sqlite::Store::ParseUrl("postgres://h/db").status().code(), Code::kInvalidArgument);
  // Something that starts like another URL is not taken for a file name.
  for (const char* other : {"bogus:thing", "postgresql:dbname=x", "redis:localhost", "file:x.db"}) {
    auto r = sqlite::Store::ParseUrl(other);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << other;
    EXPECT_NE(r.status().message().find("expected sqlite:PATH"), std::string::npos) << r.status();
  }
  EXPECT_EQ(sqlite::Store::ParseUrl("./odd:name.db")->path, "./odd:name.db");  // a path can still hold a colon
  EXPECT_EQ(sqlite::Store::ParseUrl("/tmp/a:b.db")->path, "/tmp/a:b.db");
  EXPECT_EQ(sqlite::Store::ParseUrl("sqlite:").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(sqlite::Store::ParseUrl("sqlite:x.db?synchronous=maybe").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(sqlite::Store::ParseUrl("sqlite:x.db?color=red").status().code(), Code::kInvalidArgument);
  auto tuned = sqlite::Store::ParseUrl("sqlite:x.db?page_size=2048&cache_kib=4096&wal_autocheckpoint=500");
  ASSERT_TRUE(tuned.ok());
  EXPECT_EQ(tuned->page_size, 2048);
  EXPECT_EQ(tuned->cache_kib, 4096);
  EXPECT_EQ(tuned->wal_autocheckpoint_pages, 500);
  EXPECT_EQ(sqlite::Store::ParseUrl("sqlite:x.db?page_size=big").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(sqlite::Store::ParseUrl("sqlite:x.db?busy_timeout_ms=250")->busy_timeout_ms, 250);
  // Numbers that are not whole, negative or past what SQLite takes are refused, not truncated.
  for (const char* q : {"busy_timeout_ms=banana", "busy_timeout_ms=-1", "busy_timeout_ms=99999999999999999999",
                        "page_size=4294967808", "cache_kib=4294967295", "wal_autocheckpoint=12x"}) {
    auto r = sqlite::Store::ParseUrl(std::string("sqlite:x.db?") + q);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << q;
    EXPECT_NE(r.status().message().find("must be an integer from"), std::string::npos) << r.status();
  }
  EXPECT_EQ(sqlite::Store::ParseUrl("sqlite:x.db")->checkpoint, sqlite::Checkpoint::kAuto);
  EXPECT_EQ(sqlite::Store::ParseUrl("sqlite:x.db?checkpoint=inline")->checkpoint, sqlite::Checkpoint::kInline);
  EXPECT_EQ(sqlite::Store::ParseUrl("sqlite:x.db?checkpoint=background")->checkpoint, sqlite::Checkpoint::kBackground);
  EXPECT_EQ(sqlite::Store::ParseUrl("sqlite:x.db?checkpoint=auto")->checkpoint, sqlite::Checkpoint::kAuto);
  auto bad = sqlite::Store::ParseUrl("sqlite:x.db?checkpoint=sometimes");
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("auto, background or inline"), std::string::npos) << bad.status();
}

// Delivers `n` fresh messages, each twice, through an Inbox on `store`:
// one charge each.
void DeliverTwice(Store& store, const std::string& prefix, int n) {
  auto inbox_owned = MustOpen<Inbox>(store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  for (int i = 0; i < n; ++i) {
    const std::string id = prefix + std::to_string(i);
    ASSERT_EQ(inbox.Handle(Msg(id), ChargeHandler()).kind, Outcome::Kind::kApplied) << id;
    ASSERT_EQ(inbox.Handle(Msg(id), ChargeHandler()).kind, Outcome::Kind::kDuplicate) << id;
  }
}

// With checkpoints in the background, a commit that fills the WAL only wakes
// the store's checkpointer: the checkpoint runs on its thread, never in the
// consumer's. Inline, SQLite runs it in the commit and the thread never
// starts. kAuto is background with synchronous NORMAL, inline with FULL.
TEST(SqliteStore, CheckpointsRunOnTheStoresThreadNotInTheCommit) {
  struct Case {
    sqlite::Checkpoint mode;
    sqlite::Synchronous sync;
    bool background;
  };
  for (Case c : {Case{sqlite::Checkpoint::kBackground, sqlite::Synchronous::kFull, true},
                 Case{sqlite::Checkpoint::kAuto, sqlite::Synchronous::kNormal, true},
                 Case{sqlite::Checkpoint::kInline, sqlite::Synchronous::kNormal, false},
                 Case{sqlite::Checkpoint::kAuto, sqlite::Synchronous::kFull, false}}) {
    TempDir dir;
    auto store = sqlite::Store::Open(
        {.path = dir.File("c.db"), .synchronous = c.sync, .wal_autocheckpoint_pages = 4, .checkpoint = c.mode});
    ASSERT_OK(store);
    ASSERT_TRUE(CreatePayments(**store).ok());
    std::promise<std::thread::id> ran;
    std::future<std::thread::id> ran_on = ran.get_future();
    ArmKillPoint("sqlite.checkpoint", 1, [&] { ran.set_value(std::this_thread::get_id()); });
    DeliverTwice(**store, "c-", 50);
    if (c.background) {
      // A bounded wait for the event, not a timing assertion.
      ASSERT_EQ(ran_on.wait_for(std::chrono::seconds(60)), std::future_status::ready);
      EXPECT_NE(ran_on.get(), std::this_thread::get_id());
    } else {
      EXPECT_EQ(ran_on.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
    }
    DisarmKillPoints();
    EXPECT_EQ(Charges(**store), 50);
  }
}

// The next write transaction gets the connection that committed last: its
// page cache is current. Any other connection's cache is dropped at its next
// transaction, since another connection wrote (under group commit that was
// a reread of every page a group touches). Reads take the other connections.
TEST(SqliteStore, WritesGoToTheConnectionThatCommittedLast) {
  TempDir dir;
  auto store = sqlite::Store::Open({.path = dir.File("w.db")});
  ASSERT_OK(store);
  ASSERT_TRUE(CreatePayments(**store).ok());
  for (int i = 0; i < 3; ++i) {
    auto wrote = (*store)->Begin();
    ASSERT_OK(wrote);
    ASSERT_TRUE((*wrote)
                    ->Exec("INSERT INTO payments(message_id, cents) VALUES ($1, 1)",
                           std::vector<Value>{"p" + std::to_string(i)})
                    .ok());
    ASSERT_OK((*wrote)->Commit());
    void* writer = (*wrote)->NativeHandle();
    // Another connection, used while the writer's transaction object still
    // lives, goes back to the pool after the writer: the last one returned.
    auto other = (*store)->Begin();
    ASSERT_OK(other);
    ASSERT_NE((*other)->NativeHandle(), writer);
    (*other)->Rollback();
    wrote->reset();
    other->reset();
    auto next = (*store)->Begin();
    ASSERT_OK(next);
    EXPECT_EQ((*next)->NativeHandle(), writer) << "round " << i;
  }
}

// A checkpointer that cannot keep up (here: stuck) does not let the WAL grow
// without bound: at 8 x wal_autocheckpoint pages the committing thread
// checkpoints itself. Nothing is lost, and the file reopens with every charge.
TEST(SqliteStore, TheWalStaysBoundedWhenTheCheckpointerIsStuck) {
  TempDir dir;
  const int pages = 4;
  int n = 0;  // messages charged
  {
    auto store = sqlite::Store::Open(
        {.path = dir.File("w.db"), .wal_autocheckpoint_pages = pages, .checkpoint = sqlite::Checkpoint::kBackground});
    ASSERT_OK(store);
    ASSERT_TRUE(CreatePayments(**store).ok());
    // The action owns what it touches: the checkpointer may still be
    // returning from it when this scope ends.
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    auto stuck = std::make_shared<std::promise<void>>();
    std::future<void> stuck_future = stuck->get_future();
    ArmKillPoint("sqlite.checkpoint", 1, [stuck, released] {
      stuck->set_value();
      released.wait();
    });
    uintmax_t largest = 0;
    auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
    Inbox& inbox = *inbox_owned;
    auto charge = [&] {
      const std::string id = "w-" + std::to_string(n++);
      for (int d = 0; d < 2; ++d) ASSERT_TRUE(inbox.Handle(Msg(id), ChargeHandler()).ShouldAck()) << id;
      largest = std::max(largest, std::filesystem::file_size(dir.File("w.db") + "-wal"));
    };
    // One message at a time until the checkpointer is parked at its kill
    // point (it opens its connection first, which on a loaded machine
    // takes a while, and a read it makes then would hold the WAL back),
    // then 300 more while it stays stuck.
    while (stuck_future.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready) {
      ASSERT_LT(n, 300) << "the checkpointer never reached its kill point";
      charge();
    }
    for (int i = 0; i < 300; ++i) charge();
    release.set_value();
    DisarmKillPoints();
    // Frames of 4 KiB pages plus a 24-byte header each, after a 32-byte file
    // header: at most 8 x 4 pages and one commit's pages (a few) more.
    const uintmax_t frame = 4096 + 24;
    EXPECT_LE(largest, 32 + (8 * pages + 8) * frame) << "the WAL grew to " << largest / frame << " frames";
    EXPECT_EQ(Charges(**store), n);
  }
  auto reopened = sqlite::Store::Open({.path = dir.File("w.db")});
  ASSERT_OK(reopened);
  EXPECT_EQ(Charges(**reopened), n);
}

TEST(SqliteStore, PageSizeAppliesToNewFilesAndIsValidated) {
  TempDir dir;
  auto s = sqlite::Store::Open({.path = dir.File("p.db"), .page_size = 2048});
  ASSERT_OK(s);
  auto tx = (*s)->Begin();
  auto r = (*tx)->Query("PRAGMA page_size");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rows[0][0].AsInt(), 2048);
  EXPECT_EQ(sqlite::Store::Open({.path = dir.File("q.db"), .page_size = 3000}).status().code(), Code::kInvalidArgument);
}

TEST(SqliteStore, MissingDirectoryIsAClearError) {
  auto s = sqlite::Store::Open({.path = "/nonexistent-idem-dir/sub/store.db"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable);
  EXPECT_NE(s.status().message().find("/nonexistent-idem-dir/sub"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("does not exist"), std::string::npos) << s.status();
}

TEST(SqliteStore, CorruptFileIsAClearError) {
  TempDir dir;
  std::ofstream(dir.File("bad.db")) << std::string(8192, 'x');
  auto s = sqlite::Store::Open({.path = dir.File("bad.db")});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kCorruption);
  EXPECT_NE(s.status().message().find("not a SQLite database"), std::string::npos) << s.status();
}

TEST(SqliteStore, NewerSchemaIsRefused) {
  TempDir dir;
  {
    auto s = sqlite::Store::Open({.path = dir.File("s.db")});
    ASSERT_TRUE(s.ok());
    auto tx = (*s)->Begin();
    ASSERT_TRUE((*tx)->Exec("INSERT INTO idem_migrations VALUES (99, 'from the future', 0)").ok());
    ASSERT_OK((*tx)->Commit());
  }
  auto s = sqlite::Store::Open({.path = dir.File("s.db")});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kSchemaMismatch);
  EXPECT_NE(s.status().message().find("99"), std::string::npos) << s.status();
}

TEST(SqliteStore, AVersion1FileIsMigratedAndKeepsItsMarkers) {
  TempDir dir;
  {
    auto s = sqlite::Store::Open({.path = dir.File("old.db")});
    ASSERT_TRUE(s.ok());
    auto inbox_owned = MustOpen<Inbox>(**s, Inbox::Options{.consumer = "payments"});
    Inbox& inbox = *inbox_owned;
    ASSERT_TRUE(CreatePayments(**s).ok());
    ASSERT_TRUE(inbox.Handle(Msg("m-1"), ChargeHandler()).applied());
    // Make it look like a file written by schema version 1.
    auto tx = (*s)->Begin();
    ASSERT_TRUE((*tx)->Exec("CREATE INDEX idem_markers_by_time ON idem_markers(processed_at_ms)").ok());
    ASSERT_TRUE((*tx)->Exec("DROP TABLE idem_markers_by_producer_time").ok());
    ASSERT_TRUE((*tx)->Exec("DROP TABLE idem_claims").ok());
    ASSERT_TRUE((*tx)->Exec("DROP TABLE idem_claim_fence").ok());
    ASSERT_TRUE((*tx)->Exec("DROP TABLE idem_versions").ok());
    ASSERT_TRUE((*tx)->Exec("ALTER TABLE idem_failures DROP COLUMN in_progress_since_ms").ok());
    ASSERT_TRUE((*tx)->Exec("ALTER TABLE idem_failures DROP COLUMN parked_at_ms").ok());
    for (const char* t : {"idem_outbox", "idem_outbox_sent", "idem_outbox_dead", "idem_outbox_relays",
                          "idem_outbox_handed", "idem_outbox_counter"})
      ASSERT_TRUE((*tx)->Exec(std::string("DROP TABLE ") + t).ok());
    ASSERT_TRUE((*tx)->Exec("DELETE FROM idem_migrations WHERE version > 1").ok());
    ASSERT_OK((*tx)->Commit());
  }
  auto s = sqlite::Store::Open({.path = dir.File("old.db")});
  ASSERT_OK(s);
  EXPECT_EQ((*s)->Schema()->version, 7);
  auto tx = (*s)->Begin();
  auto idx = (*tx)->Query("SELECT count(*) FROM sqlite_schema WHERE name = 'idem_markers_by_time'");
  ASSERT_TRUE(idx.ok());
  EXPECT_EQ(idx->rows[0][0].AsInt(), 0);
  (*tx)->Rollback();
  auto inbox_owned = MustOpen<Inbox>(**s, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  EXPECT_EQ(inbox.Handle(Msg("m-1"), ChargeHandler()).kind, Outcome::Kind::kDuplicate);
}

TEST(SqliteStore, WithoutCreateAFileWithoutSchemaIsRefused) {
  TempDir dir;
  auto s = sqlite::Store::Open({.path = dir.File("none.db"), .create_if_missing = false});
  EXPECT_FALSE(s.ok());
}

// An in-memory database is one per connection: the pool's connections would
// not share the markers. Refused, with what to do instead.
TEST(SqliteStore, AnInMemoryDatabaseIsRefused) {
  for (const char* path : {":memory:", "file::memory:?cache=shared"}) {
    auto s = sqlite::Store::Open({.path = path});
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
    EXPECT_NE(s.status().message().find("one per connection"), std::string::npos) << s.status();
  }
}

// One statement per call: SQLite would run the first and silently drop the
// rest (PostgreSQL refuses such a prepared statement itself).
TEST(SqliteStore, ASecondStatementInOneCallIsRefusedNotDropped) {
  TempDir dir;
  auto s = sqlite::Store::Open({.path = dir.File("s.db")});
  ASSERT_TRUE(s.ok());
  auto tx = (*s)->Begin();
  ASSERT_TRUE(tx.ok());
  ASSERT_TRUE((*tx)->Exec("CREATE TABLE t(x)").ok());
  for (int i = 0; i < 2; ++i) {
    auto two = (*tx)->Exec("INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)");
    EXPECT_EQ(two.status().code(), Code::kInvalidArgument) << two.status();
    EXPECT_NE(two.status().message().find("one statement per call"), std::string::npos) << two.status();
  }
  EXPECT_TRUE((*tx)->Exec("INSERT INTO t VALUES (3);  ;\n").ok());  // trailing semicolons are fine
  auto n = (*tx)->Query("SELECT count(*), sum(x) FROM t");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->rows[0][0].AsInt(), 1);
  EXPECT_EQ(n->rows[0][1].AsInt(), 3);
}

// Opening a store already at this build's version writes nothing, so a
// reader (idem inspect) opens it while another process holds the write lock.
TEST(SqliteStore, AStoreAtTheCurrentVersionOpensWhileAnotherProcessWrites) {
  TempDir dir;
  ASSERT_TRUE(sqlite::Store::Open({.path = dir.File("s.db")}).ok());  // created and migrated
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(dir.File("s.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE; CREATE TABLE busy(x)", nullptr, nullptr, nullptr), SQLITE_OK);
  for (int i = 0; i < 2; ++i) {
    auto reader = sqlite::Store::Open({.path = dir.File("s.db"), .busy_timeout_ms = 50, .create_if_missing = false});
    ASSERT_OK(reader);
    auto n = (*reader)->CountMarkers("");
    ASSERT_OK(n);
    EXPECT_EQ(*n, 0);
  }
  sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(other);
}

// An empty file is not a store, and looking at it does not change it.
TEST(SqliteStore, AnEmptyFileIsRefusedAndLeftEmpty) {
  TempDir dir;
  { std::ofstream(dir.File("empty.db")); }
  for (int i = 0; i < 2; ++i) {
    auto s = sqlite::Store::Open({.path = dir.File("empty.db"), .create_if_missing = false});
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), Code::kSchemaMismatch) << s.status();
    EXPECT_NE(s.status().message().find("empty database"), std::string::npos) << s.status();
    EXPECT_EQ(std::filesystem::file_size(dir.File("empty.db")), 0u);
  }
}

// A damaged schema table is reported as corruption, not as a missing schema.
TEST(SqliteStore, ADamagedMigrationsTableIsCorruptionNotAMissingSchema) {
  TempDir dir;
  const std::string path = dir.File("c.db");
  int64_t root = 0;
  {
    auto s = sqlite::Store::Open({.path = path});
    ASSERT_TRUE(s.ok());
    auto tx = (*s)->Begin();
    ASSERT_TRUE(tx.ok());
    auto r = (*tx)->Query("SELECT rootpage FROM sqlite_schema WHERE name = 'idem_migrations'");
    ASSERT_OK(r);
    root = r->rows[0][0].AsInt();
    (*tx)->Rollback();
  }  // closed: the WAL is checkpointed into the file
  ASSERT_GT(root, 1);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp((root - 1) * 4096);
    const std::string junk(4096, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  for (int i = 0; i < 2; ++i) {
    auto s = sqlite::Store::Open({.path = path, .create_if_missing = false});
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), Code::kCorruption) << s.status();
  }
}

TEST(SqliteStore, LockedDatabaseFailsWithoutLosingTheMessage) {
  TempDir dir;
  auto store = sqlite::Store::Open({.path = dir.File("s.db"), .busy_timeout_ms = 50});
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(CreatePayments(**store).ok());
  // Another process holds the write lock.
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(dir.File("s.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  for (int i = 0; i < 2; ++i) {
    Outcome o = inbox.Handle(Msg("m-1"), ChargeHandler());
    EXPECT_EQ(o.kind, Outcome::Kind::kFailed);
    EXPECT_EQ(o.status.code(), Code::kBusy) << o.status;
    EXPECT_FALSE(o.ShouldAck());
  }
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  EXPECT_EQ(inbox.Handle(Msg("m-1"), ChargeHandler()).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox.Handle(Msg("m-1"), ChargeHandler()).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(Charges(**store), 1);
}

// Claim writes outside a transaction from concurrent callers share one
// write transaction: while a lone claim's flight is held after its commit,
// the claims that come meanwhile queue, then go together in one flight,
// committed once. Each still gets its own answer and fence, a key claimed
// twice in the flight is in progress for the second caller, and every
// completion and replay is as it would be alone.
TEST(SqliteStore, ConcurrentClaimsOutsideATransactionShareOneCommit) {
  TempDir dir;
  auto store = sqlite::Store::Open({.path = dir.File("claims.db")});
  ASSERT_OK(store);
  Claims claims(*(*store)->claim_store());
  std::vector<Result<ClaimOutcome>> got;
  int commits = 0;
  ASSERT_TRUE(ClaimInOneFlight(claims, {"g-1", "g-2", "g-3", "g-4", "g-5", "g-6", "g-1"}, got, commits))
      << "the callers never waited for a flight";
  EXPECT_EQ(commits, 1) << "the queued claims' commits";
  ExpectAnsweredAsAlone(claims, got, 7, {"alone", "g-1", "g-2", "g-6"});
}

// One statement of a flight that fails (here a trigger refuses one key's
// insert) rolls back only itself, to its savepoint: its caller gets the
// error, the others of the flight start and commit, once.
TEST(SqliteStore, AFailingStatementInAClaimFlightFailsOnlyItsOwnCaller) {
  TempDir dir;
  auto store = sqlite::Store::Open({.path = dir.File("claims.db")});
  ASSERT_OK(store);
  {
    auto tx = (*store)->Begin();
    ASSERT_OK(tx);
    ASSERT_OK(
        (*tx)->Exec("CREATE TRIGGER refuse BEFORE INSERT ON idem_claims WHEN NEW.key = CAST('g-bad' AS BLOB)"
                    " BEGIN SELECT RAISE(ABORT, 'refused'); END",
                    {}));
    ASSERT_OK((*tx)->Commit());
  }
  Claims claims(*(*store)->claim_store());
  std::vector<Result<ClaimOutcome>> got;
  int commits = 0;
  ASSERT_TRUE(ClaimInOneFlight(claims, {"g-1", "g-bad", "g-2"}, got, commits))
      << "the callers never waited for a flight";
  EXPECT_EQ(commits, 1) << "the queued claims' commits";
  ASSERT_FALSE(got[2].ok());
  EXPECT_NE(got[2].status().message().find("refused"), std::string::npos) << got[2].status();
  for (size_t i : {size_t{1}, size_t{3}}) {
    ASSERT_OK(got[i]);
    ASSERT_EQ(got[i]->kind, ClaimOutcome::Kind::kStarted);
    ASSERT_OK(claims.Complete(got[i]->token, "done " + got[i]->token.key));
  }
  for (const std::string key : {"g-1", "g-2"}) {
    auto again = claims.Claim(GroupRequest(key));
    ASSERT_OK(again);
    EXPECT_EQ(again->kind, ClaimOutcome::Kind::kCompleted) << key;
  }
  auto bad = claims.store().FindClaim("group", "g-bad");
  ASSERT_OK(bad);
  EXPECT_FALSE(bad->has_value());
}

}  // namespace
}  // namespace idem::testing

namespace idem::testing {
// The stores under test: every case of StoreConformance, and (SQL stores)
// those of SqlStoreConformance.
const auto kSqliteStores =
    ::testing::Values(StoreParam{"sqlite", [](const TempDir& d, Env* env) {
                                   return sqlite::Store::Open({.path = d.File("store.db"), .env = env});
                                 }});
INSTANTIATE_TEST_SUITE_P(Stores, StoreConformance, kSqliteStores, StoreParamName);
INSTANTIATE_TEST_SUITE_P(Stores, SqlStoreConformance, kSqliteStores, StoreParamName);

INSTANTIATE_TEST_SUITE_P(Stores, OutboxConformance,
                         ::testing::Values(StoreParam{"sqlite",
                                                      [](const TempDir& d, Env* env) {
                                                        return sqlite::Store::Open(
                                                            {.path = d.File("store.db"), .env = env});
                                                      }}),
                         StoreParamName);

INSTANTIATE_TEST_SUITE_P(Stores, ClaimsConformance,
                         ::testing::Values(ClaimsParam{"sqlite",
                                                       [](const TempDir& d, Env* env) {
                                                         return ClaimsOf(sqlite::Store::Open(
                                                             {.path = d.File("claims.db"), .env = env}));
                                                       }}),
                         ClaimsParamName);
}  // namespace idem::testing
