// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Two-phase steps inside a consumer's handler (CallOnce): an external call is
// made once per (message, step) whatever the deliveries, crashes and races,
// and a crash between the call and the local commit replays the stored result
// instead of calling again. Every message is delivered at least twice.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <string>

#include "idem/claims.h"
#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "util/claims_conformance.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

// A service no transaction covers: counts calls per idempotency key.
class Service {
 public:
  Result<std::string> Call(const std::string& key) {
    std::lock_guard lock(mu_);
    return "receipt-" + std::to_string(++calls_[key]) + "-for-" + key;
  }
  int Calls(const std::string& key) {
    std::lock_guard lock(mu_);
    return calls_[key];
  }
  int Total() {
    std::lock_guard lock(mu_);
    int n = 0;
    for (auto& [k, v] : calls_) n += v;
    return n;
  }

 private:
  std::mutex mu_;
  std::map<std::string, int> calls_;
};

class TwoPhaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = sqlite::Store::Open({.path = dir_.File("inbox.db"), .env = &env_});
    ASSERT_OK(s);
    store_ = std::move(*s);
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    ASSERT_TRUE((*tx)->Exec("CREATE TABLE payments(id TEXT, receipt TEXT)").ok());
    ASSERT_OK((*tx)->Commit());
    // Claims in a file of their own (see CallOnce).
    auto c = ClaimsOf(sqlite::Store::Open({.path = dir_.File("claims.db"), .env = &env_}));
    ASSERT_OK(c);
    claim_store_ = *c;
    claims_ = MustOpen<Claims>(*claim_store_, Claims::Options{.env = &env_});
    inbox_ = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  }

  // Charges through the service once, then writes the payment row; fails
  // after the call while `fail_after_call` is set (a crash or a local error
  // between the external call and the commit).
  Handler ChargeThenRecord() {
    return [this](Transaction& tx, const Message& m) -> Status {
      auto receipt = CallOnce(*claims_, m, "charge", [&](const std::string& key) { return service_.Call(key); });
      if (!receipt.ok()) return receipt.status();
      if (fail_after_call) return Status::HandlerFailed("local write failed after the charge");
      return tx.Exec("INSERT INTO payments VALUES ($1, $2)", {m.id, *receipt}).status();
    };
  }

  std::vector<std::vector<Value>> Payments() {
    auto tx = store_->Begin();
    auto rows = (*tx)->Query("SELECT id, receipt FROM payments ORDER BY id");
    EXPECT_OK(rows);
    return rows.ok() ? rows->rows : std::vector<std::vector<Value>>{};
  }

  TempDir dir_;
  FakeEnv env_;
  std::unique_ptr<Store> store_;
  std::shared_ptr<ClaimStore> claim_store_;
  std::unique_ptr<Claims> claims_;
  std::unique_ptr<Inbox> inbox_;
  Service service_;
  bool fail_after_call = false;
};

TEST_F(TwoPhaseTest, EveryDeliveryCallsTheServiceOnce) {
  Handler h = ChargeThenRecord();
  for (int delivery = 0; delivery < 2; ++delivery)
    for (int i = 0; i < 10; ++i) {
      Outcome o = inbox_->Handle(Msg("m-" + std::to_string(i), "40"), h);
      EXPECT_EQ(o.kind, delivery == 0 ? Outcome::Kind::kApplied : Outcome::Kind::kDuplicate) << o.ToString();
    }
  EXPECT_EQ(service_.Total(), 10);
  EXPECT_EQ(Payments().size(), 10u);
  EXPECT_EQ(service_.Calls("m-3:charge"), 1) << "the call carries DownstreamKey(message, step)";
}

TEST_F(TwoPhaseTest, FailureAfterTheCallReplaysItsStoredResult) {
  Handler h = ChargeThenRecord();
  fail_after_call = true;
  Outcome first = inbox_->Handle(Msg("m-1", "40"), h);
  EXPECT_EQ(first.kind, Outcome::Kind::kFailed);
  EXPECT_EQ(service_.Calls("m-1:charge"), 1);
  fail_after_call = false;
  Outcome second = inbox_->Handle(Msg("m-1", "40"), h);  // the redelivery
  EXPECT_EQ(second.kind, Outcome::Kind::kApplied) << second.ToString();
  EXPECT_EQ(service_.Calls("m-1:charge"), 1) << "the stored receipt is replayed, the service not called again";
  auto rows = Payments();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0][1].AsText(), "receipt-1-for-m-1:charge");
}

TEST_F(TwoPhaseTest, ServiceErrorReleasesTheStepForTheNextDelivery) {
  bool down = true;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    auto r = CallOnce(*claims_, m, "charge", [&](const std::string& key) -> Result<std::string> {
      if (down) return Status::Unavailable("service down");
      return service_.Call(key);
    });
    if (!r.ok()) return r.status();
    return tx.Exec("INSERT INTO payments VALUES ($1, $2)", {m.id, *r}).status();
  };
  Outcome first = inbox_->Handle(Msg("m-1", "40"), h);
  EXPECT_EQ(first.kind, Outcome::Kind::kFailed);
  EXPECT_NE(first.status.message().find("service down"), std::string::npos) << first.ToString();
  down = false;
  EXPECT_EQ(inbox_->Handle(Msg("m-1", "40"), h).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox_->Handle(Msg("m-1", "40"), h).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(service_.Calls("m-1:charge"), 1);
}

TEST_F(TwoPhaseTest, StepHeldElsewhereIsInProgressThenReplayed) {
  // Another delivery of m-1 holds the step (it is mid-call).
  auto other = claims_->Claim({.scope = "charge", .key = "m-1:charge", .fingerprint = FingerprintOf("40")});
  ASSERT_TRUE(other.ok() && other->kind == ClaimOutcome::Kind::kStarted);
  Handler h = ChargeThenRecord();
  Outcome busy = inbox_->Handle(Msg("m-1", "40"), h);
  EXPECT_EQ(busy.kind, Outcome::Kind::kFailed);
  EXPECT_EQ(busy.status.code(), Code::kInProgress) << busy.ToString();
  ASSERT_TRUE(claims_->Complete(other->token, "receipt-from-the-other").ok());
  EXPECT_EQ(inbox_->Handle(Msg("m-1", "40"), h).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(service_.Total(), 0) << "only the other delivery called";
  EXPECT_EQ(Payments()[0][1].AsText(), "receipt-from-the-other");
}

TEST_F(TwoPhaseTest, HolderKilledMidCallIsTakenOverAfterItsLease) {
  // A child process claims the step and is SIGKILLed inside the call.
  const std::string claims_path = dir_.File("claims.db");
  pid_t pid = ::fork();
  if (pid == 0) {
    auto store = sqlite::Store::Open({.path = claims_path, .env = &env_});
    if (!store.ok()) ::_exit(2);
    auto claims_owned = MustOpen<Claims>(*(*store)->claim_store(), Claims::Options{.env = &env_});
    Claims& claims = *claims_owned;
    (void)CallOnce(claims, Msg("m-1", "40"), "charge", [](const std::string&) -> Result<std::string> {
      ::raise(SIGKILL);  // dies holding the claim, mid-call
      return std::string("never");
    });
    ::_exit(3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  Handler h = ChargeThenRecord();
  Outcome during = inbox_->Handle(Msg("m-1", "40"), h);
  EXPECT_EQ(during.status.code(), Code::kInProgress) << during.ToString();
  env_.Advance(CallOnceOptions{}.lease_ms);  // the dead holder's lease ends
  EXPECT_EQ(inbox_->Handle(Msg("m-1", "40"), h).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox_->Handle(Msg("m-1", "40"), h).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(service_.Calls("m-1:charge"), 1);
  auto rec = claim_store_->FindClaim("charge", "m-1:charge");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->state, ClaimRecord::State::kCompleted);
  EXPECT_EQ((*rec)->fence, 2) << "the taker's fence is above the dead holder's";
}

TEST_F(TwoPhaseTest, ConsumerRedeliversAStepInProgressWithoutCountingAFailure) {
  auto q = embedded::Queue::Open(
      {.path = dir_.File("queue.db"), .lease_ms = 60'000, .durable = false, .poll_ms = 50, .env = &env_});
  ASSERT_OK(q);
  for (int round = 0; round < 2; ++round) ASSERT_TRUE((*q)->Publish(Msg("m-1", "40")).ok());
  // Another process holds the step for 10 s of the consumer's clock.
  auto other =
      claims_->Claim({.scope = "charge", .key = "m-1:charge", .fingerprint = FingerprintOf("40"), .lease_ms = 10'000});
  ASSERT_TRUE(other.ok() && other->kind == ClaimOutcome::Kind::kStarted);
  // max_attempts 1: a counted failure would dead-letter the message at once.
  auto consumer_owned = MustOpen<Consumer>(
      **q, *inbox_, ChargeThenRecord(),
      Consumer::Options{.max_attempts = 1, .receive_wait_ms = 120'000, .stop_when_idle = true, .env = &env_});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  EXPECT_EQ(consumer.stats().dead_lettered, 0u);
  EXPECT_GE(consumer.stats().nacked, 1u) << "in progress: given back, not applied";
  EXPECT_EQ(service_.Calls("m-1:charge"), 1) << "called once, after the other holder's lease ended";
  EXPECT_EQ(Payments().size(), 1u);
}

// A set-up that can never work: CallOnce inside the handler with its claims
// in the inbox's own SQLite file (the Store's own ClaimStore, or another
// Store object on the same path). The inbox's transaction holds the file's
// write lock while the handler runs, so the claim's commit would wait for
// itself; CallOnce refuses it, and the Consumer stops at the first such
// delivery with the fix named: the delivery is given back, no failure is
// counted, nothing is dead-lettered and the service is never called.
TEST_F(TwoPhaseTest, ClaimsInTheInboxFileStopTheConsumerAtTheFirstDeliveryWithoutADeadLetter) {
  auto other = sqlite::Store::Open({.path = dir_.File("inbox.db"), .env = &env_});
  ASSERT_OK(other);
  for (ClaimStore* same_file : {store_->claim_store(), (*other)->claim_store()}) {
    ASSERT_NE(same_file, nullptr);
    TempDir qdir;
    auto q = embedded::Queue::Open({.path = qdir.File("queue.db"), .durable = false, .env = &env_});
    ASSERT_OK(q);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*q)->Publish(Msg("m-" + std::to_string(i), "40")).ok());
    auto claims = MustOpen<Claims>(*same_file, Claims::Options{.env = &env_});
    const Handler handler = [&](Transaction& tx, const Message& m) -> Status {
      auto receipt = CallOnce(*claims, m, "charge", [&](const std::string& key) { return service_.Call(key); });
      if (!receipt.ok()) return Status::HandlerFailed("the charge failed: " + receipt.status().message());
      return tx.Exec("INSERT INTO payments VALUES ($1, $2)", {m.id, *receipt}).status();
    };
    auto consumer = MustOpen<Consumer>(
        **q, *inbox_, handler,
        Consumer::Options{.batch = 2, .max_attempts = 1, .receive_wait_ms = 20, .stop_when_idle = true, .env = &env_});
    const Status s = consumer->Run();
    EXPECT_TRUE(s.IsInvalidArgument()) << s;
    EXPECT_NE(s.message().find("file of their own"), std::string::npos) << s;
    EXPECT_NE(s.message().find("CallFirst"), std::string::npos) << s;
    EXPECT_EQ(service_.Total(), 0);
    EXPECT_EQ(consumer->stats().dead_lettered, 0u);
    EXPECT_EQ(consumer->stats().acked, 0u);
    EXPECT_EQ(inbox_->counters().failures, 0u) << "not the message's failure";
    auto dead = store_->ListDeadLetters("payments", 10);
    ASSERT_OK(dead);
    EXPECT_TRUE(dead->empty()) << (dead->empty() ? "" : dead->front().error);
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    auto failures = (*tx)->Query("SELECT count(*) FROM idem_failures");
    ASSERT_OK(failures);
    EXPECT_EQ(failures->rows[0][0].AsInt(), 0) << "no attempt recorded";
    ASSERT_OK((*tx)->Commit());
    auto st = (*q)->Stats();
    ASSERT_OK(st);
    EXPECT_EQ(st->ready, 3) << "given back at once";
  }
  EXPECT_TRUE(Payments().empty());
}

}  // namespace
}  // namespace idem::testing
