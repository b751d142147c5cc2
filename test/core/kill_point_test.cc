// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Real crashes. For each named kill point, a forked child opens the queue and
// store files, arms the point (its default action: SIGKILL of the whole
// process) and runs a Consumer. The parent checks that the child died by
// SIGKILL, restarts a consumer on the same files and drains the queue, and
// then checks: one payments row per unique message (each was published
// twice), nothing lost, the queue empty, and that exactly the deliveries the
// child had received but not acknowledged came back, to be absorbed by the
// marker when their effect had committed.
//
// The restart reads a FakeEnv that starts at the real time: the child's
// leases (taken on the real clock) run out as the restart's Receive waits move
// the fake clock, without sleeping.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "idem/claims.h"
#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/env.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/kill_points.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

constexpr int kIds = 10;
// Longer than the child could ever need, so no lease runs out inside it.
constexpr int64_t kLeaseMs = 30'000;

std::string Id(int i) { return "m-" + std::to_string(i); }

// What the child did, written with write(2) to an O_APPEND file so that every
// line survives the SIGKILL: "R <id> <attempt>" per delivery received,
// "A <id>" per acknowledgement the queue took.
class LoggingSource final : public Source {
 public:
  LoggingSource(Source& inner, int fd) : inner_(inner), fd_(fd) {}
  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    auto got = inner_.Receive(max, wait_ms);
    if (got.ok())
      for (const Delivery& d : *got) Log("R " + d.message.id + " " + std::to_string(d.message.attempt) + "\n");
    return got;
  }
  Status Ack(const Delivery& d) override {
    Status s = inner_.Ack(d);
    if (s.ok()) Log("A " + d.message.id + "\n");
    return s;
  }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_.Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_.Kind(); }

 private:
  void Log(const std::string& line) {
    std::lock_guard<std::mutex> l(mu_);
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) ::_exit(21);
  }
  Source& inner_;
  int fd_;
  std::mutex mu_;
};

// Records what the restart receives.
class RecordingSource final : public Source {
 public:
  explicit RecordingSource(Source& inner) : inner_(inner) {}
  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    auto got = inner_.Receive(max, wait_ms);
    if (got.ok())
      for (const Delivery& d : *got) {
        ++received;
        if (d.message.attempt > 1) ++redelivered[d.message.id];
      }
    return got;
  }
  Status Ack(const Delivery& d) override { return inner_.Ack(d); }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_.Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_.Kind(); }

  int received = 0;
  std::map<std::string, int> redelivered;  // id -> deliveries with attempt > 1

 private:
  Source& inner_;
};

struct CrashCase {
  std::string name;  // for the test name
  std::string point;
  int hit;
  int batch;
  int workers;
};

void PrintTo(const CrashCase& c, std::ostream* os) {
  *os << c.point << ":" << c.hit << " batch " << c.batch << " workers " << c.workers;
}

// Where the crash leaves the message that was being handled.
enum class Fate { kRolledBack, kCommittedNotAcked, kAcked };
Fate FateOf(const std::string& point) {
  // sqlite.commit_done: the COMMIT ran, the crash came before its outcome
  // was read: committed, the caller never knew.
  if (point == "inbox.after_commit" || point == "sqlite.commit_done") return Fate::kCommittedNotAcked;
  if (point == "consumer.after_ack") return Fate::kAcked;
  return Fate::kRolledBack;  // after_receive, after_marker, after_work, batch_mid
}

class KillPoint : public ::testing::TestWithParam<CrashCase> {
 protected:
  std::string QueuePath() const { return dir_.File("queue.db"); }
  std::string StorePath() const { return dir_.File("store.db"); }
  std::string LogPath() const { return dir_.File("child.log"); }

  void Prepare() {
    auto store = sqlite::Store::Open({.path = StorePath()});
    ASSERT_OK(store);
    ASSERT_TRUE(CreatePayments(**store).ok());
    auto q = embedded::Queue::Open({.path = QueuePath(), .lease_ms = kLeaseMs});
    ASSERT_OK(q);
    for (int round = 0; round < 2; ++round)
      for (int i = 0; i < kIds; ++i) ASSERT_TRUE((*q)->Publish(Msg(Id(i))).ok());
    // Both close here: no SQLite connection crosses the fork.
  }

  // The child: a consumer with the kill point armed. Returns only when the
  // point was never reached (a test failure).
  int Child(const CrashCase& c) {
    int fd = ::open(LogPath().c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return 11;
    auto q = embedded::Queue::Open({.path = QueuePath(), .lease_ms = kLeaseMs});
    if (!q.ok()) return 12;
    auto store = sqlite::Store::Open({.path = StorePath()});
    if (!store.ok()) return 13;
    auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
    Inbox& inbox = *inbox_owned;
    LoggingSource src(**q, fd);
    auto consumer_owned = MustOpen<Consumer>(
        src, inbox, ChargeHandler(),
        Consumer::Options{.workers = c.workers, .batch = c.batch, .receive_wait_ms = 50, .stop_when_idle = true});
    Consumer& consumer = *consumer_owned;
    ArmKillPoint(c.point, c.hit);
    (void)consumer.Run();
    return 10;
  }

  struct ChildLog {
    std::vector<std::string> received;   // in order
    std::map<std::string, int> unacked;  // id -> deliveries received, not acked
    std::string last_received;
    std::set<std::string> acked_ids;
  };
  ChildLog ReadLog() {
    ChildLog log;
    std::ifstream in(LogPath());
    for (std::string line; std::getline(in, line);) {
      std::istringstream ls(line);
      std::string kind, id;
      ls >> kind >> id;
      if (kind == "R") {
        int attempt = 0;
        ls >> attempt;
        EXPECT_EQ(attempt, 1) << "no lease ran out inside the child: " << line;
        log.received.push_back(id);
        log.last_received = id;
        ++log.unacked[id];
      } else if (kind == "A") {
        log.acked_ids.insert(id);
        if (--log.unacked[id] == 0) log.unacked.erase(id);
      } else {
        ADD_FAILURE() << "bad log line: " << line;
      }
    }
    return log;
  }

  TempDir dir_;
};

TEST_P(KillPoint, CrashThenRestartAppliesEveryMessageExactlyOnce) {
  const CrashCase& c = GetParam();
  ASSERT_NO_FATAL_FAILURE(Prepare());

  int status = RunInChild([&] { return Child(c); });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << c.point << ":" << c.hit << " did not crash the child (wait status " << status << ", exit code "
      << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << ")";

  ChildLog log = ReadLog();
  ASSERT_FALSE(log.received.empty());
  int unacked = 0;
  for (auto& [id, n] : log.unacked) {
    EXPECT_GT(n, 0) << id;
    unacked += n;
  }
  EXPECT_LT(static_cast<int>(log.received.size()), 2 * kIds) << "the crash came before the end";

  // The state the crash left.
  std::set<std::string> marked_before;
  {
    auto store = sqlite::Store::Open({.path = StorePath()});
    ASSERT_OK(store);
    auto markers = (*store)->ListMarkers("payments", 1000);
    ASSERT_OK(markers);
    for (const Marker& m : *markers) marked_before.insert(m.id);
    for (int i = 0; i < kIds; ++i)
      EXPECT_EQ(Charges(**store, Id(i)), marked_before.count(Id(i)) ? 1 : 0)
          << Id(i) << ": marker and effect commit together";
  }
  EXPECT_FALSE(marked_before.empty()) << "some messages were done before the crash";
  const std::string& crashed = log.last_received;
  const Fate fate = FateOf(c.point);
  if (c.workers == 1) {
    switch (fate) {
      case Fate::kRolledBack:
        EXPECT_EQ(marked_before.count(crashed), 0u) << crashed << ": its transaction was rolled back";
        EXPECT_EQ(unacked, c.batch) << "the whole crashed receive is unacknowledged";
        break;
      case Fate::kCommittedNotAcked:
        EXPECT_EQ(marked_before.count(crashed), 1u) << crashed << ": committed before the crash";
        EXPECT_EQ(unacked, c.batch);
        EXPECT_GT(log.unacked.count(crashed), 0u) << crashed << ": not acknowledged";
        break;
      case Fate::kAcked:
        EXPECT_EQ(marked_before.count(crashed), 1u) << crashed;
        EXPECT_EQ(unacked, 0);
        EXPECT_EQ(log.acked_ids.count(crashed), 1u) << crashed;
        break;
    }
  } else {
    EXPECT_GT(unacked, 0);
  }

  // The clean restart, with leases that the fake clock runs out.
  FakeEnv env(Env::Default()->NowMs());
  auto q = embedded::Queue::Open({.path = QueuePath(), .lease_ms = kLeaseMs, .poll_ms = 200, .env = &env});
  ASSERT_OK(q);
  auto store = sqlite::Store::Open({.path = StorePath(), .env = &env});
  ASSERT_OK(store);
  auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments", .env = &env});
  Inbox& inbox = *inbox_owned;
  RecordingSource src(**q);
  std::map<std::string, int> calls;
  Handler h = [&](Transaction& tx, const Message& m) {
    ++calls[m.id];
    return ChargeHandler()(tx, m);
  };
  auto consumer_owned = MustOpen<Consumer>(
      src, inbox, h, Consumer::Options{.receive_wait_ms = 2 * kLeaseMs, .stop_when_idle = true, .env = &env});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());

  // Exactly once, nothing lost, the queue empty.
  for (int i = 0; i < kIds; ++i) EXPECT_EQ(Charges(**store, Id(i)), 1) << Id(i);
  EXPECT_EQ(Charges(**store), kIds);
  auto count = (*store)->CountMarkers("payments");
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, kIds);
  auto st = (*q)->Stats();
  ASSERT_OK(st);
  EXPECT_EQ(st->ready, 0);
  EXPECT_EQ(st->leased, 0);
  EXPECT_EQ(st->delayed, 0);
  EXPECT_EQ(st->published, 2 * kIds);
  EXPECT_EQ(st->acked, 2 * kIds);
  auto dead = (*store)->ListDeadLetters("payments", 10);
  ASSERT_TRUE(dead.ok());
  EXPECT_TRUE(dead->empty());

  if (c.workers == 1) {
    // Exactly the deliveries the child held unacknowledged came back.
    EXPECT_EQ(src.redelivered, log.unacked);
    EXPECT_EQ(src.received, 2 * kIds - static_cast<int>(log.received.size()) + unacked);
  } else {
    // With two workers the SIGKILL may fall between one worker's queue call
    // and its log line, so the log is exact only up to that. Still: a
    // message without a marker was never acknowledged (an ack needs a commit
    // or a marker), so each such delivery the child held came back.
    EXPECT_FALSE(src.redelivered.empty());
    for (auto& [id, n] : log.unacked) {
      if (marked_before.count(id) == 0) {
        EXPECT_GE(src.redelivered[id], n) << id;
      }
    }
  }
  // The markers absorbed every delivery of a message done before the crash;
  // every other message ran its handler once.
  for (int i = 0; i < kIds; ++i) {
    const std::string id = Id(i);
    EXPECT_EQ(calls[id], marked_before.count(id) ? 0 : 1) << id;
  }
  InboxCounters ic = inbox.counters();
  EXPECT_EQ(ic.applied, static_cast<uint64_t>(kIds) - marked_before.size());
  EXPECT_EQ(ic.duplicates, static_cast<uint64_t>(src.received) - ic.applied);
  EXPECT_EQ(ic.failures, 0u);
  if (c.workers == 1 && fate == Fate::kCommittedNotAcked) {
    // The committed-but-unacknowledged delivery came back (attempt 2) and was
    // a duplicate: no second effect.
    EXPECT_EQ(src.redelivered[crashed], log.unacked[crashed]) << crashed;
    EXPECT_EQ(calls[crashed], 0) << crashed;
    EXPECT_GE(ic.duplicates, 1u);
  }
  if (c.workers == 1 && fate == Fate::kRolledBack) {
    EXPECT_GT(src.redelivered[crashed], 0) << crashed;
    EXPECT_EQ(calls[crashed], 1) << crashed << ": applied by its redelivery";
  }
}

INSTANTIATE_TEST_SUITE_P(Points, KillPoint,
                         ::testing::Values(
                             // The third receive: its delivery held, nothing begun.
                             CrashCase{"after_receive", "consumer.after_receive", 3, 1, 1},
                             // The third message: SQLite ran its COMMIT, its outcome not read.
                             CrashCase{"sqlite_commit_done", "sqlite.commit_done", 3, 1, 1},
                             CrashCase{"batch_sqlite_commit_done", "sqlite.commit_done", 2, 4, 1},
                             // The third new message: its marker is in the open transaction.
                             CrashCase{"after_marker", "inbox.after_marker", 3, 1, 1},
                             // The third message: handler done, COMMIT not issued.
                             CrashCase{"after_work", "inbox.after_work", 3, 1, 1},
                             // The third message: committed, not acknowledged.
                             CrashCase{"after_commit", "inbox.after_commit", 3, 1, 1},
                             // A producer's second copy, a duplicate: committed (nothing), not acked.
                             CrashCase{"after_commit_on_duplicate", "inbox.after_commit", kIds + 2, 1, 1},
                             // The third message: acknowledged, then the crash.
                             CrashCase{"after_ack", "consumer.after_ack", 3, 1, 1},
                             // The second batch of four: two handlers done, nothing committed.
                             CrashCase{"batch_mid", "inbox.batch_mid", 2, 4, 1},
                             // The second batch of four: all handlers done, COMMIT not issued.
                             CrashCase{"batch_after_work", "inbox.after_work", 2, 4, 1},
                             // The second batch of four: committed, none acknowledged.
                             CrashCase{"batch_after_commit", "inbox.after_commit", 2, 4, 1},
                             // Two workers: the other worker's delivery is in flight too.
                             CrashCase{"two_workers_after_commit", "inbox.after_commit", 4, 1, 2},
                             CrashCase{"two_workers_after_marker", "inbox.after_marker", 4, 2, 2}),
                         [](const ::testing::TestParamInfo<CrashCase>& p) { return p.param.name; });

// consumer.lease_lost: the child's handler, at its second message, lets the
// lease run out (the fake clock past it) and a second handle on the queue
// takes the deliveries over; the child's lease keeper is then refused its
// renewal and the kill point crashes the child there, inside the handler.
// The restart applies every message exactly once.
TEST(KillPointLeaseLost, ACrashWhereTheHolderLearnsItLostItsLeaseLosesAndDoublesNothing) {
  TempDir dir;
  const std::string queue_path = dir.File("queue.db"), store_path = dir.File("store.db");
  constexpr int64_t kLease = 1'000;
  constexpr int kMessages = 4;
  {
    auto store = sqlite::Store::Open({.path = store_path});
    ASSERT_OK(store);
    ASSERT_TRUE(CreatePayments(**store).ok());
    auto q = embedded::Queue::Open({.path = queue_path, .lease_ms = kLease});
    ASSERT_OK(q);
    for (int i = 0; i < kMessages; ++i) ASSERT_TRUE((*q)->Publish(Msg(Id(i))).ok());
  }
  const int status = RunInChild([&] {
    FakeEnv env(Env::Default()->NowMs());
    auto q = embedded::Queue::Open({.path = queue_path, .lease_ms = kLease, .env = &env});
    auto thief = embedded::Queue::Open({.path = queue_path, .lease_ms = kLease, .env = &env});
    auto store = sqlite::Store::Open({.path = store_path});
    if (!q.ok() || !thief.ok() || !store.ok()) return 12;
    auto inbox = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
    int handled = 0;
    Handler h = [&](Transaction& tx, const Message& m) -> Status {
      if (++handled == 2) {
        env.Advance(2 * kLease);
        auto taken = (*thief)->Receive(kMessages, 0);  // the takeover: this delivery among them
        if (!taken.ok() || taken->empty()) ::_exit(14);
        // The keeper's next renewal is refused: the kill point. (Bounded:
        // the test fails if it never comes.)
        for (int i = 0; i < 1'000; ++i) ::usleep(10'000);
        ::_exit(15);
      }
      return ChargeHandler()(tx, m);
    };
    auto consumer = MustOpen<Consumer>(**q, *inbox, h,
                                       Consumer::Options{.receive_wait_ms = 50, .stop_when_idle = true, .env = &env});
    ArmKillPoint("consumer.lease_lost");
    (void)consumer->Run();
    return 10;
  });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "consumer.lease_lost did not crash the child (wait status " << status << ", exit code "
      << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << ")";

  auto store = sqlite::Store::Open({.path = store_path});
  ASSERT_OK(store);
  EXPECT_EQ(Charges(**store), 1) << "the first message was done, the second's transaction died with the child";
  // The restart: a fake clock that the waits move past every lease.
  FakeEnv env(Env::Default()->NowMs() + 10 * kLease);
  auto q = embedded::Queue::Open({.path = queue_path, .lease_ms = kLease, .poll_ms = 200, .env = &env});
  ASSERT_OK(q);
  auto inbox = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
  auto consumer =
      MustOpen<Consumer>(**q, *inbox, ChargeHandler(),
                         Consumer::Options{.receive_wait_ms = 4 * kLease, .stop_when_idle = true, .env = &env});
  ASSERT_TRUE(consumer->Run().ok());
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(Charges(**store, Id(i)), 1) << Id(i);
  auto st = (*q)->Stats();
  ASSERT_OK(st);
  EXPECT_EQ(st->acked, kMessages);
  EXPECT_EQ(st->ready + st->leased + st->delayed, 0);
}

// The claim kill points, on SQLite claims: claims.finish_done (the store
// finished the claim, the holder crashed before it heard) and
// claims.lease_lost (the holder's Complete refused: fenced by a takeover).
class ClaimKillPoint : public ::testing::Test {
 protected:
  static ClaimRequest Req(int64_t lease_ms) {
    return ClaimRequest{.scope = "charges", .key = "k1", .fingerprint = FingerprintOf("{}"), .lease_ms = lease_ms};
  }
  std::string Path() const { return dir_.File("claims.db"); }
  TempDir dir_;
};

TEST_F(ClaimKillPoint, ACrashAfterTheStoreFinishedAClaimKeepsItsResult) {
  const int status = RunInChild([&] {
    auto store = sqlite::Store::Open({.path = Path()});
    if (!store.ok()) return 12;
    auto claims = MustOpen<Claims>(*(*store)->claim_store());
    auto c = claims->Claim(Req(60'000));
    if (!c.ok() || c->kind != ClaimOutcome::Kind::kStarted) return 13;
    ArmKillPoint("claims.finish_done");
    (void)claims->Complete(c->token, "ch_1");
    return 10;
  });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "claims.finish_done did not crash the child (wait status " << status << ")";
  // The holder never heard; the store did it: a retry replays the result.
  auto store = sqlite::Store::Open({.path = Path()});
  ASSERT_OK(store);
  auto claims = MustOpen<Claims>(*(*store)->claim_store());
  auto again = claims->Claim(Req(60'000));
  ASSERT_OK(again);
  EXPECT_EQ(again->kind, ClaimOutcome::Kind::kCompleted);
  EXPECT_EQ(again->result, "ch_1");
}

TEST_F(ClaimKillPoint, AFencedHolderCrashingWhereItLearnsSoLeavesTheTakeoverInCharge) {
  const int64_t start = Env::Default()->NowMs();
  const int status = RunInChild([&] {
    FakeEnv env(start);
    auto store = sqlite::Store::Open({.path = Path(), .env = &env});
    if (!store.ok()) return 12;
    auto claims = MustOpen<Claims>(*(*store)->claim_store(), Claims::Options{.env = &env});
    auto first = claims->Claim(Req(1'000));
    if (!first.ok() || first->kind != ClaimOutcome::Kind::kStarted) return 13;
    env.Advance(2'000);  // the holder paused past its lease
    auto second = claims->Claim(Req(60'000));
    if (!second.ok() || second->kind != ClaimOutcome::Kind::kStarted) return 14;
    ArmKillPoint("claims.lease_lost");
    (void)claims->Complete(first->token, "ch_zombie");  // refused: the kill point
    return 10;
  });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "claims.lease_lost did not crash the child (wait status " << status << ")";
  FakeEnv env(start + 2'000);
  auto store = sqlite::Store::Open({.path = Path(), .env = &env});
  ASSERT_OK(store);
  auto rec = (*store)->claim_store()->FindClaim("charges", "k1");
  ASSERT_TRUE(rec.ok() && rec->has_value()) << rec.status();
  EXPECT_EQ((*rec)->state, ClaimRecord::State::kInProgress) << "the zombie's result was never stored";
  EXPECT_EQ((*rec)->fence, 2) << "the takeover's claim stands";
  // The takeover died with the child: after its lease a third holder
  // finishes the work once.
  env.Advance(61'000);
  auto claims = MustOpen<Claims>(*(*store)->claim_store(), Claims::Options{.env = &env});
  auto third = claims->Claim(Req(1'000));
  ASSERT_OK(third);
  ASSERT_EQ(third->kind, ClaimOutcome::Kind::kStarted);
  EXPECT_EQ(third->token.fence, 3);
  ASSERT_TRUE(claims->Complete(third->token, "ch_3").ok());
  auto replay = claims->Claim(Req(1'000));
  ASSERT_OK(replay);
  EXPECT_EQ(replay->kind, ClaimOutcome::Kind::kCompleted);
  EXPECT_EQ(replay->result, "ch_3");
}

}  // namespace
}  // namespace idem::testing
