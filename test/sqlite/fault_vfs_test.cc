// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The fault VFS (idem/testing/fault_vfs.h): its spec, that it forwards
// faithfully, the power-loss model file by file, and an I/O-error sweep: for
// every operation of the write path (and every read) that one Inbox call
// makes, a run where exactly that operation fails (or it and every later one,
// or the disk is full). Each run must leave each message all or nothing, and
// redelivering it must then apply it exactly once.
#include "idem/testing/fault_vfs.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "idem/claims.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "util/fault_vfs_util.h"
#include "util/recording_observer.h"
#include "util/sqlite_claim_flights.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using sqlite::FaultVfs;
using Op = FaultVfs::Op;
using Action = FaultVfs::Action;
using FileKind = FaultVfs::FileKind;

// Every test starts and ends with a pass-through VFS.
class FaultVfsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(Vfs().Reset().ok()); }
  void TearDown() override { EXPECT_TRUE(Vfs().Reset().ok()); }
};

// --- the spec ------------------------------------------------------------------

TEST(FaultVfsSpec, ParsesEveryForm) {
  struct Good {
    const char* spec;
    bool power_loss;
    bool has_fault;
    FaultVfs::Fault fault;
    const char* canonical;
  };
  const Good cases[] = {
      {"", false, false, {}, ""},
      {"powerloss", true, false, {}, "powerloss"},
      {"fail:write:37:transient",
       false,
       true,
       {Action::kIoError, Op::kWrite, FileKind::kAny, 37, false},
       "fail:write:37:transient"},
      {"fail:any:120:persistent",
       false,
       true,
       {Action::kIoError, Op::kAnyWrite, FileKind::kAny, 120, true},
       "fail:any:120:persistent"},
      {"kill:sync:5", false, true, {Action::kKill, Op::kSync, FileKind::kAny, 5, false}, "kill:sync:5"},
      {"full:write:10", false, true, {Action::kFull, Op::kWrite, FileKind::kAny, 10, false}, "full:write:10:transient"},
      {"cut:any@wal:3", false, true, {Action::kPowerCut, Op::kAnyWrite, FileKind::kWal, 3, false}, "cut:any@wal:3"},
      {"fail:read@db:1:persistent",
       false,
       true,
       {Action::kIoError, Op::kRead, FileKind::kDb, 1, true},
       "fail:read@db:1:persistent"},
      {"full:truncate@journal:2",
       false,
       true,
       {Action::kFull, Op::kTruncate, FileKind::kJournal, 2, false},
       "full:truncate@journal:2:transient"},
      {" powerloss , kill:sync:5 ",
       true,
       true,
       {Action::kKill, Op::kSync, FileKind::kAny, 5, false},
       "powerloss,kill:sync:5"},
      {"kill:write@wal:7,powerloss",
       true,
       true,
       {Action::kKill, Op::kWrite, FileKind::kWal, 7, false},
       "powerloss,kill:write@wal:7"},
  };
  for (const Good& c : cases) {
    SCOPED_TRACE(c.spec);
    auto config = FaultVfs::Parse(c.spec);
    ASSERT_OK(config);
    EXPECT_EQ(config->power_loss, c.power_loss);
    ASSERT_EQ(config->fault.has_value(), c.has_fault);
    if (c.has_fault) {
      EXPECT_EQ(config->fault->action, c.fault.action);
      EXPECT_EQ(config->fault->op, c.fault.op);
      EXPECT_EQ(config->fault->file, c.fault.file);
      EXPECT_EQ(config->fault->at, c.fault.at);
      EXPECT_EQ(config->fault->persistent, c.fault.persistent);
    }
    const std::string canonical = FaultVfs::Format(*config);
    EXPECT_EQ(canonical, c.canonical);
    auto again = FaultVfs::Parse(canonical);
    ASSERT_OK(again);
    EXPECT_EQ(FaultVfs::Format(*again), canonical);
  }
}

TEST(FaultVfsSpec, RejectsMalformedSpecsSayingWhichItem) {
  struct Bad {
    const char* spec;
    const char* names;  // the message must contain this
  };
  const Bad cases[] = {
      {"fail", "'fail'"},
      {"fail:write", "'fail:write'"},
      {"fail:write:0", "'0'"},
      {"fail:write:-3", "'-3'"},
      {"fail:write:+3", "'+3'"},
      {"fail:write:x", "'x'"},
      {"fail:write:12abc", "'12abc'"},
      {"fail:write:", "''"},
      {"fail:write:99999999999999999999999", "99999999999999999999999"},
      {"fail:write:3:forever", "'forever'"},
      {"fail:write:3:transient:again", "wrong number"},
      {"kill:sync:5:persistent", "wrong number"},
      {"cut:any:5:transient", "wrong number"},
      {"boom:write:1", "'boom'"},
      {"fail:erase:1", "'erase'"},
      {"fail:write@shm:1", "'shm'"},
      {"fail:write:1,fail:sync:2", "only one fault"},
      {"powerloss,", "empty item"},
      {",powerloss", "empty item"},
      {"power-loss", "'power-loss'"},
      {"FAIL:write:1", "'FAIL'"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.spec);
    auto config = FaultVfs::Parse(c.spec);
    ASSERT_FALSE(config.ok()) << FaultVfs::Format(*config);
    EXPECT_EQ(config.status().code(), Code::kInvalidArgument);
    EXPECT_NE(config.status().message().find(c.names), std::string::npos) << config.status();
    EXPECT_NE(config.status().message().find(c.spec), std::string::npos) << config.status();
  }
}

TEST_F(FaultVfsTest, ConfiguresFromTheEnvironment) {
  ::unsetenv(FaultVfs::kEnvVar);
  auto none = Vfs().ConfigureFromEnv();
  ASSERT_OK(none);
  EXPECT_FALSE(*none);

  ::setenv(FaultVfs::kEnvVar, "powerloss,fail:sync:2", 1);
  auto set = Vfs().ConfigureFromEnv();
  ASSERT_OK(set);
  EXPECT_TRUE(*set);
  EXPECT_TRUE(Vfs().power_loss());

  ::setenv(FaultVfs::kEnvVar, "fail:sync", 1);
  auto bad = Vfs().ConfigureFromEnv();
  ::unsetenv(FaultVfs::kEnvVar);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(FaultVfs::kEnvVar), std::string::npos) << bad.status();
}

// --- choosing a VFS ------------------------------------------------------------

TEST(SqliteVfsOption, ParseUrlTakesAVfs) {
  auto o = sqlite::Store::ParseUrl("sqlite:/tmp/x.db?vfs=idem-fault&synchronous=normal");
  ASSERT_OK(o);
  EXPECT_EQ(o->vfs, "idem-fault");
  EXPECT_EQ(o->path, "/tmp/x.db");
  auto plain = sqlite::Store::ParseUrl("sqlite:/tmp/x.db");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->vfs, "");
  auto empty = sqlite::Store::ParseUrl("sqlite:/tmp/x.db?vfs=");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), Code::kInvalidArgument);

  auto q = embedded::Queue::ParseUrl("embedded:/tmp/q.db?vfs=idem-fault");
  ASSERT_OK(q);
  EXPECT_EQ(q->vfs, "idem-fault");
}

TEST(SqliteVfsOption, AnUnknownVfsIsRefusedAtOpenByName) {
  TempDir dir;
  auto o = sqlite::Store::ParseUrl("sqlite:" + dir.File("s.db") + "?vfs=no-such-vfs");
  ASSERT_OK(o);
  auto store = sqlite::Store::Open(*o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Code::kInvalidArgument);
  EXPECT_NE(store.status().message().find("'no-such-vfs'"), std::string::npos) << store.status();
  EXPECT_NE(store.status().message().find("unix"), std::string::npos)
      << "lists the registered ones: " << store.status();

  auto queue = embedded::Queue::Open({.path = dir.File("q.db"), .vfs = "no-such-vfs"});
  ASSERT_FALSE(queue.ok());
  EXPECT_NE(queue.status().message().find("'no-such-vfs'"), std::string::npos) << queue.status();
}

// --- forwarding -------------------------------------------------------------------

std::string VfsNameOf(Store& store) {
  auto tx = store.Begin();
  EXPECT_OK(tx);
  if (!tx.ok()) return "";
  char* name = nullptr;
  auto* db = static_cast<sqlite3*>((*tx)->NativeHandle());
  if (sqlite3_file_control(db, "main", SQLITE_FCNTL_VFSNAME, &name) != SQLITE_OK || name == nullptr) return "";
  std::string out(name);
  sqlite3_free(name);
  return out;
}

TEST_F(FaultVfsTest, AStoreAndAQueueWorkThroughIt) {
  TempDir dir;
  std::unique_ptr<Store> store = OpenThroughFaultVfs(dir.File("s.db"));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(CreatePayments(*store).ok());
  EXPECT_EQ(VfsNameOf(*store).rfind("idem-fault/", 0), 0u) << VfsNameOf(*store);

  auto queue = embedded::Queue::Open({.path = dir.File("q.db"), .vfs = FaultVfs::kName});
  ASSERT_OK(queue);
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 10; ++i) ASSERT_TRUE((*queue)->Publish(Msg("m-" + std::to_string(i))).ok());

  Vfs().ResetCounters();
  auto inbox_owned = MustOpen<Inbox>(*store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  int applied = 0, duplicates = 0;
  for (;;) {
    auto got = (*queue)->Receive(3, 0);
    ASSERT_OK(got);
    if (got->empty()) break;
    std::vector<Message> batch;
    for (auto& d : *got) batch.push_back(d.message);
    auto outcomes = inbox.HandleBatch(batch, ChargeHandler());
    for (size_t i = 0; i < outcomes.size(); ++i) {
      ASSERT_TRUE(outcomes[i].ShouldAck()) << outcomes[i].ToString();
      (outcomes[i].applied() ? applied : duplicates)++;
      ASSERT_TRUE((*queue)->Ack((*got)[i]).ok());
    }
  }
  EXPECT_EQ(applied, 10);
  EXPECT_EQ(duplicates, 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(Charges(*store, "m-" + std::to_string(i)), 1);
  FaultVfs::Counters c = Vfs().counters();
  EXPECT_GT(c.writes, 0);
  EXPECT_GT(c.syncs, 0);
  EXPECT_EQ(c.faults, 0);
  EXPECT_EQ(IntegrityCheck(*store), "ok");
}

// --- the power-loss model, one file at a time --------------------------------------

// A file opened straight through the VFS's methods.
class RawFile {
 public:
  static std::unique_ptr<RawFile> Open(const std::string& path, int flags = SQLITE_OPEN_MAIN_DB) {
    sqlite3_vfs* vfs = sqlite3_vfs_find(FaultVfs::kName);
    EXPECT_NE(vfs, nullptr);
    if (vfs == nullptr) return nullptr;
    auto f = std::unique_ptr<RawFile>(new RawFile(vfs, path));
    int rc = vfs->xOpen(vfs, f->name_.c_str(), f->file(), flags | SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
    if (rc != SQLITE_OK) {
      f->last_rc = rc;
      return nullptr;
    }
    f->open_ = true;
    return f;
  }
  ~RawFile() {
    if (open_) file()->pMethods->xClose(file());
  }
  int Write(const std::string& data, int64_t offset) {
    return file()->pMethods->xWrite(file(), data.data(), static_cast<int>(data.size()), offset);
  }
  int Read(std::string& out, int n, int64_t offset) {
    out.assign(n, '?');
    return file()->pMethods->xRead(file(), out.data(), n, offset);
  }
  int Sync() { return file()->pMethods->xSync(file(), SQLITE_SYNC_NORMAL); }
  int Truncate(int64_t size) { return file()->pMethods->xTruncate(file(), size); }
  int64_t Size() {
    sqlite3_int64 size = -1;
    last_rc = file()->pMethods->xFileSize(file(), &size);
    return last_rc == SQLITE_OK ? size : -1;
  }

  int last_rc = SQLITE_OK;

 private:
  RawFile(sqlite3_vfs* vfs, const std::string& path)
      : name_(path + std::string(3, '\0')), mem_(new char[vfs->szOsFile]()) {}
  sqlite3_file* file() { return reinterpret_cast<sqlite3_file*>(mem_.get()); }
  std::string name_;  // must outlive the open file
  std::unique_ptr<char[]> mem_;
  bool open_ = false;
};

// The bytes on disk, read past the VFS.
std::string OnDisk(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Two copies of one message in one batch whose COMMIT fails in doubt (the
// WAL's fsync fails): the second copy was judged a duplicate of the marker
// the batch itself inserted, so neither copy may be acknowledged. (Found by
// the power-loss test: the second copy used to come back kDuplicate.)
TEST_F(FaultVfsTest, ABatchWhoseCommitFailsInDoubtAcknowledgesNoCopy) {
  TempDir dir;
  std::unique_ptr<Store> store = OpenThroughFaultVfs(dir.File("s.db"));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(CreatePayments(*store).ok());
  Recorder told;
  auto inbox_owned = MustOpen<Inbox>(*store, Inbox::Options{.consumer = "payments", .observer = &told});
  Inbox& inbox = *inbox_owned;
  Vfs().Arm({.action = Action::kIoError, .op = Op::kSync, .at = 1});
  const std::vector<Message> first = {Msg("a"), Msg("a"), Msg("b")};
  auto outcomes = inbox.HandleBatch(first, ChargeHandler());
  Vfs().Disarm();
  ASSERT_EQ(outcomes.size(), 3u);
  for (const Outcome& out : outcomes) EXPECT_FALSE(out.ShouldAck()) << out.ToString();
  EXPECT_EQ(Charges(*store, "a"), 0);
  // The observer is told how each commit in doubt was read back.
  EXPECT_EQ(told.Of(EventKind::kInDoubtNotCommitted).size(), 2u);  // "a" (its first copy) and "b"
  EXPECT_EQ(told.Of(EventKind::kInDoubtCommitted).size(), 0u);
  // Delivered again (twice): applied once.
  const std::vector<Message> again = {Msg("a"), Msg("b")};
  for (int round = 0; round < 2; ++round)
    for (const Outcome& out : inbox.HandleBatch(again, ChargeHandler())) EXPECT_TRUE(out.ShouldAck()) << out.ToString();
  EXPECT_EQ(Charges(*store, "a"), 1);
  EXPECT_EQ(Charges(*store, "b"), 1);
}

// Claims that shared a flight whose COMMIT failed (here its WAL sync) are
// each answered with an error that says they may not have happened, never
// started; claimed again once the disk is back, each is answered again
// (started if its write is not there, in progress if it is).
TEST_F(FaultVfsTest, AClaimFlightWhoseCommitFailsAnswersEveryCallerWithAnError) {
  TempDir dir;
  std::unique_ptr<Store> store = OpenThroughFaultVfs(dir.File("claims.db"));
  ASSERT_NE(store, nullptr);
  Claims claims(*store->claim_store());
  const std::vector<std::string> keys = {"f-1", "f-2", "f-3"};
  std::vector<Result<ClaimOutcome>> got;
  int commits = 0;
  ASSERT_TRUE(ClaimInOneFlight(claims, keys, got, commits, [] {
    Vfs().Arm({.action = Action::kIoError, .op = Op::kSync, .at = 1});
  })) << "the callers never waited for a flight";
  Vfs().Disarm();
  ASSERT_OK(got[0]);
  EXPECT_EQ(got[0]->kind, ClaimOutcome::Kind::kStarted);  // the lone claim, committed before
  for (size_t i = 1; i < got.size(); ++i) {
    ASSERT_FALSE(got[i].ok()) << keys[i - 1] << ": " << static_cast<int>(got[i]->kind);
    EXPECT_TRUE(got[i].status().IsUnavailable() || got[i].status().IsInDoubt()) << got[i].status();
  }
  for (const std::string& key : keys) {
    auto again = claims.Claim(GroupRequest(key));
    ASSERT_OK(again);
    EXPECT_TRUE(again->kind == ClaimOutcome::Kind::kStarted || again->kind == ClaimOutcome::Kind::kInProgress) << key;
  }
}

TEST_F(FaultVfsTest, HeldBackWritesAreReadBackAndOnlySyncedOnesSurviveACut) {
  TempDir dir;
  const std::string path = dir.File("f.db");
  ASSERT_TRUE(Vfs().SetPowerLoss(true).ok());
  {
    auto f = RawFile::Open(path);
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(f->Write(std::string(5000, 'a'), 0), SQLITE_OK);
    EXPECT_EQ(OnDisk(path), "") << "held back, not written";
    EXPECT_EQ(f->Size(), 5000);
    ASSERT_EQ(f->Sync(), SQLITE_OK);
    EXPECT_EQ(OnDisk(path), std::string(5000, 'a'));

    // Across a block edge, and past a hole.
    ASSERT_EQ(f->Write(std::string(200, 'b'), 4000), SQLITE_OK);
    ASSERT_EQ(f->Write("cc", 10'000), SQLITE_OK);
    EXPECT_EQ(f->Size(), 10'002);
    std::string got;
    ASSERT_EQ(f->Read(got, 10'002, 0), SQLITE_OK);
    EXPECT_EQ(got,
              std::string(4000, 'a') + std::string(200, 'b') + std::string(800, 'a') + std::string(5000, '\0') + "cc");
    // Past the end: zeros, and SQLite is told the read was short.
    EXPECT_EQ(f->Read(got, 10, 9'996), SQLITE_IOERR_SHORT_READ);
    EXPECT_EQ(got, std::string(4, '\0') + "cc" + std::string(4, '\0'));
    EXPECT_EQ(OnDisk(path), std::string(5000, 'a')) << "still held back";

    Vfs().PowerCut();
    EXPECT_TRUE(Vfs().dead());
    EXPECT_EQ(f->Read(got, 10, 0), SQLITE_IOERR_READ);
    EXPECT_EQ(f->Write("x", 0), SQLITE_IOERR_WRITE);
    EXPECT_EQ(f->Sync(), SQLITE_IOERR_FSYNC);
    EXPECT_EQ(f->Truncate(0), SQLITE_IOERR_TRUNCATE);
    EXPECT_EQ(f->Size(), -1);
    EXPECT_EQ(RawFile::Open(dir.File("other.db")), nullptr) << "nothing opens while the power is off";
  }
  ASSERT_TRUE(Vfs().Revive().ok());
  EXPECT_EQ(OnDisk(path), std::string(5000, 'a'));
  auto again = RawFile::Open(path);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->Size(), 5000);
  FaultVfs::Counters c = Vfs().counters();
  EXPECT_EQ(c.power_cuts, 1);
  EXPECT_EQ(c.dropped_writes, 2);
}

TEST_F(FaultVfsTest, TruncatesAreHeldBackAndReadAsZerosWhenTheFileGrowsAgain) {
  TempDir dir;
  const std::string path = dir.File("t.db");
  {
    auto f = RawFile::Open(path);
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(f->Write(std::string(9000, 'a'), 0), SQLITE_OK);  // not in power-loss mode: written at once
  }
  ASSERT_TRUE(Vfs().SetPowerLoss(true).ok());
  {
    auto f = RawFile::Open(path);
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(f->Truncate(4500), SQLITE_OK);
    EXPECT_EQ(f->Size(), 4500);
    EXPECT_EQ(OnDisk(path).size(), 9000u);
    ASSERT_EQ(f->Write("z", 6000), SQLITE_OK);
    std::string got;
    ASSERT_EQ(f->Read(got, 6001, 0), SQLITE_OK);
    EXPECT_EQ(got, std::string(4500, 'a') + std::string(1500, '\0') + "z") << "the truncated bytes do not come back";
    ASSERT_EQ(f->Sync(), SQLITE_OK);
    EXPECT_EQ(OnDisk(path), got);

    ASSERT_EQ(f->Truncate(100), SQLITE_OK);  // held back, then cut
    EXPECT_EQ(f->Size(), 100);
    Vfs().PowerCut();
  }
  ASSERT_TRUE(Vfs().Revive().ok());
  EXPECT_EQ(OnDisk(path).size(), 6001u);
}

TEST_F(FaultVfsTest, AFileCreatedAndNeverSyncedVanishesAtTheCut) {
  TempDir dir;
  // The unix VFS creates a WAL only beside its database (it copies its mode).
  std::ofstream(dir.File("never.db"));
  std::ofstream(dir.File("synced.db"));
  ASSERT_TRUE(Vfs().SetPowerLoss(true).ok());
  {
    auto never = RawFile::Open(dir.File("never.db-wal"), SQLITE_OPEN_WAL);
    auto synced = RawFile::Open(dir.File("synced.db-wal"), SQLITE_OPEN_WAL);
    ASSERT_NE(never, nullptr);
    ASSERT_NE(synced, nullptr);
    ASSERT_EQ(never->Write("abc", 0), SQLITE_OK);
    ASSERT_EQ(synced->Write("abc", 0), SQLITE_OK);
    ASSERT_EQ(synced->Sync(), SQLITE_OK);
    ASSERT_EQ(synced->Write("def", 3), SQLITE_OK);
    EXPECT_TRUE(Exists(dir.File("never.db-wal")));
    Vfs().PowerCut();
  }
  ASSERT_TRUE(Vfs().Revive().ok());
  EXPECT_FALSE(Exists(dir.File("never.db-wal")));
  EXPECT_EQ(OnDisk(dir.File("synced.db-wal")), "abc");
}

TEST_F(FaultVfsTest, HandlesOfOneFileShareWhatIsHeldBack) {
  TempDir dir;
  const std::string path = dir.File("shared.db");
  ASSERT_TRUE(Vfs().SetPowerLoss(true).ok());
  auto a = RawFile::Open(path);
  auto b = RawFile::Open(path);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(a->Write("hello", 0), SQLITE_OK);
  std::string got;
  ASSERT_EQ(b->Read(got, 5, 0), SQLITE_OK);
  EXPECT_EQ(got, "hello");
  EXPECT_EQ(b->Size(), 5);
  ASSERT_EQ(b->Sync(), SQLITE_OK) << "a sync through any handle makes the file durable";
  EXPECT_EQ(OnDisk(path), "hello");
}

TEST_F(FaultVfsTest, ReviveWaitsUntilEveryFileOpenAtTheCutIsClosed) {
  TempDir dir;
  ASSERT_TRUE(Vfs().SetPowerLoss(true).ok());
  auto f = RawFile::Open(dir.File("r.db"));
  ASSERT_NE(f, nullptr);
  Vfs().PowerCut();
  Status s = Vfs().Revive();
  EXPECT_EQ(s.code(), Code::kBusy) << s;
  EXPECT_TRUE(Vfs().dead());
  f.reset();
  ASSERT_TRUE(Vfs().Revive().ok());
  EXPECT_FALSE(Vfs().dead());
  EXPECT_NE(RawFile::Open(dir.File("r.db")), nullptr);
}

TEST_F(FaultVfsTest, LeavingPowerLossModeWritesWhatIsHeldBack) {
  TempDir dir;
  const std::string path = dir.File("l.db");
  ASSERT_TRUE(Vfs().SetPowerLoss(true).ok());
  {
    auto f = RawFile::Open(path);
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(f->Write("kept", 0), SQLITE_OK);
  }  // closed: the change outlives the handle, as dirty pages do
  EXPECT_EQ(OnDisk(path), "");
  ASSERT_TRUE(Vfs().SetPowerLoss(false).ok());
  EXPECT_EQ(OnDisk(path), "kept");
}

TEST_F(FaultVfsTest, AStoreCommitSurvivesACutOnlyWhenSynced) {
  for (auto sync : {sqlite::Synchronous::kFull, sqlite::Synchronous::kNormal}) {
    SCOPED_TRACE(sync == sqlite::Synchronous::kFull ? "FULL" : "NORMAL");
    TempDir dir;
    sqlite::Store::Options o{.path = dir.File("s.db"), .synchronous = sync, .vfs = FaultVfs::kName};
    {
      auto store = sqlite::Store::Open(o);
      ASSERT_OK(store);
      ASSERT_TRUE(CreatePayments(**store).ok());
    }  // closed: checkpointed into the database file
    ASSERT_TRUE(Vfs().SetPowerLoss(true).ok());
    {
      auto store = sqlite::Store::Open(o);
      ASSERT_OK(store);
      auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
      Inbox& inbox = *inbox_owned;
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(inbox.Handle(Msg("m-" + std::to_string(i)), ChargeHandler()).applied());
      EXPECT_EQ(Charges(**store), 3);
      Vfs().PowerCut();
    }
    ASSERT_TRUE(Vfs().Revive().ok());
    auto store = sqlite::Store::Open(o);
    ASSERT_OK(store);
    EXPECT_EQ(Charges(**store), sync == sqlite::Synchronous::kFull ? 3 : 0);
    EXPECT_EQ(IntegrityCheck(**store), "ok");
    store->reset();
    ASSERT_TRUE(Vfs().Reset().ok());
  }
}

// --- the I/O-error sweep ------------------------------------------------------------

struct SweepCase {
  std::string name;
  Op op;
  Action action;
  bool persistent;
  int messages;              // 1: Inbox::Handle; more: one HandleBatch
  bool reopen_before_retry;  // else the same Store (and its pooled connection) retries
};

void PrintTo(const SweepCase& c, std::ostream* os) { *os << c.name; }

int64_t OpsOf(const FaultVfs::Counters& c, Op op) {
  switch (op) {
    case Op::kRead: return c.reads;
    case Op::kWrite: return c.writes;
    case Op::kSync: return c.syncs;
    case Op::kTruncate: return c.truncates;
    case Op::kAnyWrite: return c.writes + c.syncs + c.truncates;
  }
  return 0;
}

class IoErrorSweep : public FaultVfsTest, public ::testing::WithParamInterface<SweepCase> {
 protected:
  static std::unique_ptr<Store> OpenStore(const TempDir& dir) {
    auto store = sqlite::Store::Open({.path = dir.File("s.db"), .vfs = FaultVfs::kName});
    EXPECT_OK(store);
    return store.ok() ? std::move(*store) : nullptr;
  }
  // A new database with the payments table, opened again so that the
  // operation under test starts from a cold cache (it reads, too).
  static std::unique_ptr<Store> FreshStore(const TempDir& dir) {
    {
      auto store = OpenStore(dir);
      if (store == nullptr || !CreatePayments(*store).ok()) return nullptr;
    }
    return OpenStore(dir);
  }
  std::vector<Outcome> Process(Store& store) {
    auto inbox_owned = MustOpen<Inbox>(store, Inbox::Options{.consumer = "payments"});
    Inbox& inbox = *inbox_owned;
    if (messages_.size() == 1) return {inbox.Handle(messages_[0], ChargeHandler())};
    return inbox.HandleBatch(messages_, ChargeHandler());
  }
  // Each message has its marker and its row, or neither.
  void ExpectAllOrNothing(Store& store, const std::vector<Outcome>& outcomes, bool committed_unknown_ok) {
    for (size_t i = 0; i < messages_.size(); ++i) {
      auto marker = store.FindMarker("payments", messages_[i].id);
      ASSERT_OK(marker);
      const int64_t rows = Charges(store, messages_[i].id);
      EXPECT_EQ(marker->has_value() ? 1 : 0, rows) << messages_[i].id << ": marker and effect disagree";
      if (outcomes[i].applied()) {
        EXPECT_EQ(rows, 1) << messages_[i].id << " was reported applied";
      } else if (!committed_unknown_ok || outcomes[i].status.code() != Code::kInDoubt) {
        EXPECT_EQ(rows, 0) << messages_[i].id << " was reported failed: " << outcomes[i].ToString();
      }
    }
  }
  void ExpectExactlyOnce(Store& store) {
    for (const Message& m : messages_) {
      auto marker = store.FindMarker("payments", m.id);
      ASSERT_OK(marker);
      EXPECT_TRUE(marker->has_value()) << m.id;
      EXPECT_EQ(Charges(store, m.id), 1) << m.id;
    }
    EXPECT_EQ(Charges(store), static_cast<int64_t>(messages_.size()));
    auto markers = store.CountMarkers("payments");
    ASSERT_OK(markers);
    EXPECT_EQ(*markers, static_cast<int64_t>(messages_.size()));
    EXPECT_EQ(IntegrityCheck(store), "ok");
  }

  std::vector<Message> messages_;
};

TEST_P(IoErrorSweep, EachFailedOperationLeavesAllOrNothingAndTheRedeliveryAppliesOnce) {
  const SweepCase& c = GetParam();
  for (int i = 0; i < c.messages; ++i) messages_.push_back(Msg("order-" + std::to_string(i)));

  // How many operations of the class one processing takes.
  int64_t k = 0;
  {
    TempDir dir;
    auto store = FreshStore(dir);
    ASSERT_NE(store, nullptr);
    Vfs().ResetCounters();
    for (const Outcome& o : Process(*store)) ASSERT_TRUE(o.applied()) << o.ToString();
    k = OpsOf(Vfs().counters(), c.op);
  }
  ASSERT_GT(k, 0) << "processing took no operation of the class: nothing to sweep";
  std::cout << "[ sweep    ] " << c.name << ": " << k << " operations\n";

  int failed_runs = 0;
  bool saw_disk_full = false;
  for (int64_t n = 1; n <= k; ++n) {
    SCOPED_TRACE("operation " + std::to_string(n) + " of " + std::to_string(k));
    TempDir dir;
    auto store = FreshStore(dir);
    ASSERT_NE(store, nullptr);
    Vfs().ResetCounters();
    Vfs().Arm({.action = c.action, .op = c.op, .at = n, .persistent = c.persistent});
    std::vector<Outcome> first = Process(*store);
    const FaultVfs::Counters fired = Vfs().counters();
    ASSERT_GE(fired.faults, 1) << "the operation was never reached: the counting run and this one differ";
    bool failed = false;
    for (const Outcome& o : first) {
      if (o.applied()) continue;
      failed = true;
      EXPECT_EQ(o.kind, Outcome::Kind::kFailed) << o.ToString();
      if (o.status.message().find("full") != std::string::npos) saw_disk_full = true;
    }
    failed_runs += failed;

    if (c.reopen_before_retry) {
      // Closed with the fault still armed: a persistent one fails the
      // checkpoint of the last close too, so the next open recovers from the
      // WAL, where a commit whose fsync failed may be whole (in doubt).
      store.reset();
      Vfs().Disarm();
      store = OpenStore(dir);
      ASSERT_NE(store, nullptr);
      EXPECT_EQ(IntegrityCheck(*store), "ok");
      ASSERT_NO_FATAL_FAILURE(ExpectAllOrNothing(*store, first, /*committed_unknown_ok=*/true));
    } else {
      // Right after the fault, on the same store.
      Vfs().Disarm();
      ASSERT_NO_FATAL_FAILURE(ExpectAllOrNothing(*store, first, /*committed_unknown_ok=*/false));
    }
    // Delivered again, twice: applied once, then duplicates.
    for (int round = 0; round < 2; ++round)
      for (const Outcome& o : Process(*store)) EXPECT_TRUE(o.ShouldAck()) << "round " << round << ": " << o.ToString();
    ASSERT_NO_FATAL_FAILURE(ExpectExactlyOnce(*store));
    store.reset();
    store = OpenStore(dir);
    ASSERT_NE(store, nullptr);
    ASSERT_NO_FATAL_FAILURE(ExpectExactlyOnce(*store));
  }
  EXPECT_GT(failed_runs, 0) << "no injected fault made processing fail: the sweep tested nothing";
  if (c.action == Action::kFull) {
    EXPECT_TRUE(saw_disk_full) << "no outcome said the disk was full";
  }
}

INSTANTIATE_TEST_SUITE_P(
    WritePath, IoErrorSweep,
    ::testing::Values(SweepCase{"IoErrorTransient", Op::kAnyWrite, Action::kIoError, false, 1, false},
                      SweepCase{"IoErrorPersistent", Op::kAnyWrite, Action::kIoError, true, 1, false},
                      SweepCase{"IoErrorPersistentReopen", Op::kAnyWrite, Action::kIoError, true, 1, true},
                      SweepCase{"IoErrorTransientBatch", Op::kAnyWrite, Action::kIoError, false, 3, true},
                      SweepCase{"DiskFullTransient", Op::kAnyWrite, Action::kFull, false, 1, false},
                      SweepCase{"DiskFullPersistentBatch", Op::kAnyWrite, Action::kFull, true, 3, true},
                      SweepCase{"ReadErrorTransient", Op::kRead, Action::kIoError, false, 1, false},
                      SweepCase{"ReadErrorPersistentBatch", Op::kRead, Action::kIoError, true, 3, true}),
    [](const ::testing::TestParamInfo<SweepCase>& info) { return info.param.name; });

}  // namespace
}  // namespace idem::testing
