// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Idempotency::WrapInTransaction on a real ::httplib::Server over loopback, on
// SQLite: the key's record, the handler's effect (a row in `effects`) and the
// stored response commit together, one request per transaction or in groups
// (Options::group_commit_max). Handlers that must be "still running" block on
// a Gate the test opens; nothing sleeps. Every key is sent at least twice.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "http/http_test_util.h"
#include "idem/http/idempotency.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/fault_vfs.h"
#include "util/fault_vfs_util.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using http::Idempotency;

// group_commit_max: 0 (each request its own transaction) or 64; fibers: the
// server's connections as fibers on that many threads (0: a thread each).
struct Commits {
  int group = 0;
  int fibers = 0;
};
void PrintTo(const Commits& c, std::ostream* os) { *os << "groups of " << c.group << ", fibers " << c.fibers; }
std::string CommitsName(const ::testing::TestParamInfo<Commits>& p) {
  return (p.param.group == 0 ? std::string("EachItsOwn") : "GroupsOf" + std::to_string(p.param.group)) +
         (p.param.fibers > 0 ? "OnFibers" : "");
}

class TransactionalRouteTest : public ::testing::TestWithParam<Commits> {
 protected:
  void SetUp() override {
    // Through the fault VFS (passing everything through until a test arms it).
    (void)Vfs();
    auto s = sqlite::Store::Open({.path = dir_.File("idem.db"), .env = &env_, .vfs = sqlite::FaultVfs::kName});
    ASSERT_OK(s);
    store_ = std::move(*s);
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    ASSERT_TRUE((*tx)->Exec("CREATE TABLE effects(k TEXT NOT NULL, amount INTEGER NOT NULL)", {}).ok());
    ASSERT_OK((*tx)->Commit());
    claims_ = std::make_unique<Claims>(*store_->claim_store());
    idem_ = OpenMiddleware(*claims_, http::BearerKeys({{"sk_a", "acct_a"}}),
                           http::Idempotency::Options{.env = &env_, .group_commit_max = GetParam().group});
  }
  void TearDown() override {
    Vfs().Disarm();
    server_.Stop();
  }

  // POST /charges: inserts a row (the effect) through the route's
  // transaction, then answers 201 -- or 400 for a negative amount, after
  // writing its row, which the middleware must roll back.
  void Route(std::function<void(const std::string& key)> before = nullptr) {
    auto handler = [this, before](const ::httplib::Request& req, ::httplib::Response& res, Transaction& tx) {
      const std::string key = http::CurrentClaim()->key;
      if (before) before(key);
      auto body = nlohmann::json::parse(req.body, nullptr, false);
      const int64_t amount = body.value("amount", 0);
      Value row[] = {key, amount};
      if (auto w = tx.Exec("INSERT INTO effects(k, amount) VALUES ($1, $2)", row); !w.ok()) {
        res.status = 500;
        return;
      }
      const int n = ++executions_;
      if (body.value("throw", false)) throw std::runtime_error("handler bug");
      if (amount < 0) {
        res.status = 400;
        res.set_content(R"({"error":"amount must be positive"})", "application/json");
        return;
      }
      res.status = 201;
      res.set_header("Location", "/charges/" + key);
      res.set_content(nlohmann::json{{"key", key}, {"amount", amount}, {"execution", n}}.dump(), "application/json");
    };
    server_.server().Post("/charges",
                          Must(idem::httplib::WrapInTransaction(*idem_, "/charges", policy_, *store_, handler)));
    server_.set_fibers(GetParam().fibers);
    server_.Start();
  }
  Reply Post(const std::string& key, int64_t amount, bool throws = false) {
    nlohmann::json body = {{"amount", amount}, {"currency", "usd"}};
    if (throws) body["throw"] = true;
    return Send(server_.port(), "POST", "/charges", Headers("sk_a", Quoted(key)), body.dump());
  }
  // Committed effect rows for `key` ("" for all).
  int64_t Effects(const std::string& key = "") {
    auto tx = store_->Begin();
    EXPECT_OK(tx);
    if (!tx.ok()) return -1;
    Value p[] = {key};
    auto rows = (*tx)->Query("SELECT count(*) FROM effects WHERE $1 = '' OR k = $1", p);
    EXPECT_OK(rows);
    return rows.ok() ? rows->rows[0][0].AsInt() : -1;
  }
  // Sends every request at once, each on its own connection.
  std::vector<Reply> Burst(const std::vector<std::pair<std::string, int64_t>>& requests) {
    std::vector<Reply> replies(requests.size());
    Latch start(static_cast<int>(requests.size()));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < requests.size(); ++i) {
      threads.emplace_back([&, i] {
        start.ArriveAndWait();
        replies[i] = Post(requests[i].first, requests[i].second);
      });
    }
    for (auto& t : threads) t.join();
    return replies;
  }

  TempDir dir_;
  FakeEnv env_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Claims> claims_;
  std::unique_ptr<Idempotency> idem_;
  LoopbackServer server_{128};
  std::atomic<int> executions_{0};
  http::RoutePolicy policy_;
};

INSTANTIATE_TEST_SUITE_P(Commits, TransactionalRouteTest,
                         ::testing::Values(Commits{0, 0}, Commits{64, 0}, Commits{64, 2}), CommitsName);

TEST_P(TransactionalRouteTest, TheEffectAndTheResponseCommitTogetherAndReplay) {
  Route();
  Reply first = Post("k-1", 4000);
  ASSERT_EQ(first.status, 201) << first.body;
  EXPECT_FALSE(first.replayed());
  for (int again = 0; again < 2; ++again) {
    Reply r = Post("k-1", 4000);
    EXPECT_TRUE(r.replayed());
    ExpectSameResponse(first, r);
  }
  EXPECT_EQ(Effects("k-1"), 1);
  EXPECT_EQ(Post("k-1", 8000).status, 422);  // another body with the key
  EXPECT_EQ(Effects(), 1);
  EXPECT_EQ(idem_->counters().executed, 1u);
}

// Forty keys at once, every fifth one answered 400 after writing its row:
// those rows roll back with their keys (released: sent again, they run
// again), every other request commits once -- grouped or not.
TEST_P(TransactionalRouteTest, AResponseNotStoredRollsBackItsEffectAndNoOtherRequests) {
  Route();
  std::vector<std::pair<std::string, int64_t>> requests;
  for (int i = 0; i < 40; ++i) requests.emplace_back("b-" + std::to_string(i), i % 5 == 0 ? -1 : 100 + i);
  for (int delivery = 0; delivery < 2; ++delivery) {
    auto replies = Burst(requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      const Reply& r = replies[i];
      ASSERT_TRUE(r.ok) << r.error;
      if (requests[i].second < 0) {
        EXPECT_EQ(r.status, 400) << r.body;
        EXPECT_FALSE(r.replayed());
      } else {
        EXPECT_EQ(r.status, 201) << r.body;
        EXPECT_EQ(r.replayed(), delivery == 1) << requests[i].first;
        EXPECT_EQ(r.json().value("key", ""), requests[i].first);
      }
    }
  }
  EXPECT_EQ(Effects(), 32);
  for (const auto& [key, amount] : requests) EXPECT_EQ(Effects(key), amount < 0 ? 0 : 1) << key;
  auto c = idem_->counters();
  EXPECT_EQ(c.replayed, 32u);
  if (GetParam().group > 1) {
    EXPECT_GE(c.grouped_requests, 32u);  // every stored response came through a group
    EXPECT_LE(c.group_commits, c.grouped_requests);
  } else {
    EXPECT_EQ(c.group_commits, 0u);
  }
}

// RoutePolicy::validate refuses a request before its key is claimed: the
// handler never runs, nothing is stored, and the key stays free.
TEST_P(TransactionalRouteTest, AValidateRefusalClaimsNothingAndLeavesTheKeyFree) {
  policy_.validate = [](const http::Request& req, http::Answer& res) {
    if (nlohmann::json::parse(req.body, nullptr, false).value("amount", 0) >= 0) return true;
    res.status = 400;
    res.SetBody(R"({"error":"amount must be positive"})", "application/json");
    return false;
  };
  Route();
  for (int delivery = 0; delivery < 2; ++delivery) {
    Reply r = Post("v-1", -5);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.body, R"({"error":"amount must be positive"})");
    EXPECT_FALSE(r.replayed());
  }
  EXPECT_EQ(executions_, 0);
  EXPECT_EQ(idem_->counters().invalid, 2u);
  Reply ok = Post("v-1", 10);  // another body with the key: not 422, the key was never taken
  EXPECT_EQ(ok.status, 201) << ok.body;
  EXPECT_TRUE(Post("v-1", 10).replayed());
  EXPECT_EQ(Effects("v-1"), 1);
}

TEST_P(TransactionalRouteTest, AThrowingHandlerIs500AndItsEffectRollsBack) {
  Route();
  for (int delivery = 0; delivery < 2; ++delivery) {
    Reply r = Post("t-1", 4000, /*throws=*/true);
    EXPECT_EQ(r.status, 500) << r.body;
  }
  EXPECT_EQ(Effects("t-1"), 0);
  Reply ok = Post("t-1", 4000);  // released: the fixed request runs
  EXPECT_EQ(ok.status, 201) << ok.body;
  EXPECT_EQ(Effects("t-1"), 1);
}

// The commit's fsync fails: no request of that commit is answered 2xx (503
// commit-failed, retry with the same key), and the retries apply once.
TEST_P(TransactionalRouteTest, ACommitThatFailsAnswersNoRequestOfItAsDoneAndRetriesApplyOnce) {
  Route();
  std::vector<std::pair<std::string, int64_t>> requests;
  for (int i = 0; i < 24; ++i) requests.emplace_back("f-" + std::to_string(i), 100 + i);
  Vfs().Arm({.op = sqlite::FaultVfs::Op::kSync, .file = sqlite::FaultVfs::FileKind::kWal, .at = 1});
  auto replies = Burst(requests);
  Vfs().Disarm();
  int failed = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Reply& r = replies[i];
    ASSERT_TRUE(r.ok) << r.error;
    if (r.status == 503) {
      ++failed;
      EXPECT_EQ(r.json().value("type", ""), "https://idem.dev/problems/commit-failed") << r.body;
      EXPECT_EQ(r.json().value("retry", ""), "same-key");
      EXPECT_EQ(Effects(requests[i].first), 0) << requests[i].first;
    } else {
      EXPECT_EQ(r.status, 201) << r.body;
      EXPECT_EQ(Effects(requests[i].first), 1) << requests[i].first;
    }
  }
  EXPECT_GE(failed, 1);
  EXPECT_GE(Vfs().counters().faults, 1);
  for (int delivery = 0; delivery < 2; ++delivery) {
    auto again = Burst(requests);
    for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(again[i].status, 201) << again[i].body;
  }
  for (const auto& [key, amount] : requests) EXPECT_EQ(Effects(key), 1) << key;
  EXPECT_EQ(IntegrityCheck(*store_), "ok");
}

TEST_P(TransactionalRouteTest, AHundredConcurrentRequestsWithOneKeyMakeOneEffect) {
  Route();
  std::vector<std::pair<std::string, int64_t>> requests(100, {"one-key", 4000});
  auto replies = Burst(requests);
  int executed = 0;
  const Reply* first = nullptr;
  for (const Reply& r : replies) {
    ASSERT_TRUE(r.ok) << r.error;
    ASSERT_EQ(r.status, 201) << r.body;  // a duplicate waits for the commit, then replays: no 409
    if (!r.replayed()) {
      ++executed;
      first = &r;
    }
  }
  ASSERT_EQ(executed, 1);
  for (const Reply& r : replies) ExpectSameResponse(*first, r);
  EXPECT_EQ(Effects("one-key"), 1);
}

// The requests that arrive while a group runs wait, and then share the next
// transaction and its one commit.
class GroupCommitTest : public TransactionalRouteTest {
 protected:
  // Holds a first group (one request, key "<prefix>first") open while the
  // others are sent, each on its own thread, until `queued` of them wait;
  // then `before_open`, and the held group goes on: the queued requests
  // make the next group. Answers the others' replies, in order.
  std::vector<Reply> BehindAHeldGroup(const std::string& prefix, const std::vector<int64_t>& amounts, uint64_t queued,
                                      const std::function<void()>& before_open = nullptr) {
    // The route's hook outlives this call (later requests of the test run it
    // too): it owns what it uses, nothing of this frame.
    auto gate = std::make_shared<Gate>();
    Route([gate, first_key = prefix + "first"](const std::string& key) {
      if (key == first_key) gate->Arrive();
    });
    Reply first;
    std::thread t([&] { first = Post(prefix + "first", 1); });
    gate->WaitArrived();  // the first group (of one) is running
    std::vector<Reply> others(amounts.size());
    std::vector<std::thread> senders;
    for (size_t i = 0; i < amounts.size(); ++i)
      senders.emplace_back([&, i] { others[i] = Post(prefix + std::to_string(i), amounts[i]); });
    while (idem_->counters().group_queue < queued) std::this_thread::yield();
    if (before_open) before_open();
    gate->Open();
    t.join();
    for (auto& s : senders) s.join();
    EXPECT_EQ(first.status, 201) << first.body;
    return others;
  }
  void GroupWithInvalidRequests(bool validate);
};
INSTANTIATE_TEST_SUITE_P(Commits, GroupCommitTest, ::testing::Values(Commits{64, 0}, Commits{64, 2}), CommitsName);

TEST_P(GroupCommitTest, RequestsArrivingDuringACommitShareTheNextOne) {
  constexpr int kOthers = 31;
  std::vector<Reply> others = BehindAHeldGroup("g-", std::vector<int64_t>(kOthers, 2), kOthers);
  for (const Reply& r : others) ASSERT_EQ(r.status, 201) << r.body;
  auto c = idem_->counters();
  EXPECT_EQ(c.group_commits, 2u);
  EXPECT_EQ(c.grouped_requests, 32u);
  EXPECT_EQ(c.group_queue, 0u);
  EXPECT_EQ(Effects(), 32);
  for (int i = 0; i < kOthers; ++i) EXPECT_TRUE(Post("g-" + std::to_string(i), 2).replayed());
}

// A group holding requests whose handler answers 4xx is rolled back and run
// again without each of them; with RoutePolicy::validate refusing them
// first, they never join the group. The same 32 requests each way, queued
// behind a first group held open, so they make one group.
void GroupCommitTest::GroupWithInvalidRequests(bool validate) {
  if (validate) {
    policy_.validate = [](const http::Request& req, http::Answer& res) {
      if (nlohmann::json::parse(req.body, nullptr, false).value("amount", 0) >= 0) return true;
      res.status = 400;
      return false;
    };
  }
  std::vector<int64_t> amounts;
  for (int i = 0; i < 32; ++i) amounts.push_back(i % 4 == 0 ? -1 : 2);  // 8 of 32 invalid
  // Those refused by validate are answered at once, never queued.
  std::vector<Reply> others = BehindAHeldGroup("r-", amounts, validate ? 24 : 32);
  for (size_t i = 0; i < amounts.size(); ++i) EXPECT_EQ(others[i].status, amounts[i] < 0 ? 400 : 201) << others[i].body;
  auto c = idem_->counters();
  EXPECT_EQ(c.group_commits, 2u);
  EXPECT_EQ(c.grouped_requests, 25u);
  EXPECT_EQ(c.group_reruns, validate ? 0u : 8u);
  EXPECT_EQ(c.invalid, validate ? 8u : 0u);
  EXPECT_EQ(Effects(), 25);
  for (size_t i = 0; i < amounts.size(); ++i) {
    if (amounts[i] > 0) {
      EXPECT_TRUE(Post("r-" + std::to_string(i), 2).replayed()) << i;
    }
  }
}

TEST_P(GroupCommitTest, AHandlers4xxRunsTheGroupAgainWithoutIt) { GroupWithInvalidRequests(/*validate=*/false); }

TEST_P(GroupCommitTest, RequestsRefusedByValidateNeverJoinAGroup) { GroupWithInvalidRequests(/*validate=*/true); }

// A whole group's commit fails: every request of it is answered 503
// commit-failed, none has an effect, and each retry applies once.
TEST_P(GroupCommitTest, AFailedGroupCommitAnswersEveryRequestOfIt503) {
  constexpr int kOthers = 12;
  std::vector<Reply> others = BehindAHeldGroup("h-", std::vector<int64_t>(kOthers, 2), kOthers, [] {
    // The first group's commit syncs the WAL once; the second one's sync fails.
    Vfs().Arm({.op = sqlite::FaultVfs::Op::kSync, .file = sqlite::FaultVfs::FileKind::kWal, .at = 2});
  });
  Vfs().Disarm();
  for (int i = 0; i < kOthers; ++i) {
    EXPECT_EQ(others[i].status, 503) << others[i].body;
    EXPECT_EQ(others[i].json().value("type", ""), "https://idem.dev/problems/commit-failed") << others[i].body;
    EXPECT_EQ(Effects("h-" + std::to_string(i)), 0);
  }
  EXPECT_EQ(idem_->counters().group_commits, 1u);
  for (int delivery = 0; delivery < 2; ++delivery)
    for (int i = 0; i < kOthers; ++i) {
      Reply r = Post("h-" + std::to_string(i), 2);
      EXPECT_EQ(r.status, 201) << r.body;
      EXPECT_EQ(r.replayed(), delivery == 1);
    }
  EXPECT_EQ(Effects(), kOthers + 1);
  EXPECT_EQ(IntegrityCheck(*store_), "ok");
}

}  // namespace
}  // namespace idem::testing
