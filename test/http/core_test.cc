// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The framework-neutral core (idem/http/idempotency.h) driven with its own
// Request and Answer: no server, no socket, no HTTP library. What a user of
// another framework sees: Open's validation, a two-phase and a
// transactional route, replays, conflicts, the refusals before any claim,
// Headers' case-insensitive lookup, and Serve with a per-request handler (the
// way an adapter calls it).
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "idem/http/idempotency.h"
#include "idem/http/request.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "util/recording_observer.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using http::Answer;
using http::Idempotency;
using http::Request;

constexpr char kBody[] = R"({"amount":4000,"currency":"usd"})";

Request Post(const std::string& key, const std::string& body = kBody, const std::string& bearer = "sk_a") {
  Request req{.method = "POST", .path = "/charges", .headers = {}, .body = body};
  req.headers.Add("authorization", "Bearer " + bearer);  // any case: names are case-insensitive
  if (!key.empty()) req.headers.Add("IDEMPOTENCY-KEY", key);
  return req;
}

class CoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s =
        sqlite::Store::Open({.path = dir_.File("idem.db"), .synchronous = sqlite::Synchronous::kNormal, .env = &env_});
    ASSERT_OK(s);
    store_ = std::move(*s);
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    ASSERT_TRUE((*tx)->Exec("CREATE TABLE effects(k TEXT NOT NULL)", {}).ok());
    ASSERT_OK((*tx)->Commit());
    claims_ = std::make_unique<Claims>(*store_->claim_store());
    auto m = Idempotency::Open({.claims = claims_.get(),
                                .authenticate = http::BearerKeys({{"sk_a", "acct_a"}}),
                                .env = &env_,
                                .log = [this](const std::string& line) { log_ += line + "\n"; },
                                .observer = &told_});
    ASSERT_OK(m);
    idem_ = std::move(*m);
  }

  http::Handler Charge() {
    auto h = idem_->Wrap("/charges", {}, [this](const Request& req, Answer& ans) {
      ++executions_;
      ans.status = 201;
      ans.headers.Add("Location", "/charges/ch_" + std::to_string(executions_));
      ans.SetBody(R"({"id":"ch_)" + std::to_string(executions_) + R"(","request":)" + req.body + "}",
                  "application/json");
    });
    EXPECT_OK(h);
    return h.ok() ? std::move(*h) : nullptr;
  }

  TempDir dir_;
  FakeEnv env_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Claims> claims_;
  std::unique_ptr<Idempotency> idem_;
  int executions_ = 0;
  std::string log_;
  Recorder told_;
};

TEST(HeadersTest, NamesAreCaseInsensitiveAndSetReplacesEveryField) {
  http::Headers h{{"Set-Cookie", "a=1"}, {"set-cookie", "b=2"}, {"Content-Type", "text/plain"}};
  EXPECT_EQ(h.Count("SET-COOKIE"), 2u);
  EXPECT_EQ(h.Get("content-type"), "text/plain");
  EXPECT_EQ(h.Find("x-missing"), nullptr);
  EXPECT_EQ(h.Get("x-missing"), "");
  h.Set("Set-Cookie", "c=3");
  EXPECT_EQ(h.Count("set-cookie"), 1u);
  EXPECT_EQ(h.Get("Set-Cookie"), "c=3");
  h.Remove("CONTENT-TYPE");
  EXPECT_FALSE(h.Has("Content-Type"));
  EXPECT_EQ(h.size(), 1u);
}

TEST_F(CoreTest, OpenRefusesWhatCannotWork) {
  auto refused = [](const auto& r, const std::string& field) {
    return !r.ok() && r.status().code() == Code::kInvalidArgument &&
           r.status().message().find(field) != std::string::npos;
  };
  auto auth = http::BearerKeys({{"sk_a", "acct_a"}});
  EXPECT_TRUE(refused(Idempotency::Open({.authenticate = auth}), "claims"));
  EXPECT_TRUE(refused(Idempotency::Open({.claims = claims_.get()}), "authenticate"));
  EXPECT_TRUE(refused(Idempotency::Open({.claims = claims_.get(), .authenticate = auth, .max_keys_per_principal = -1}),
                      "max_keys_per_principal"));
  EXPECT_TRUE(refused(Idempotency::Open({.claims = claims_.get(), .authenticate = auth, .group_commit_max = -1}),
                      "group_commit_max"));
  EXPECT_TRUE(refused(Idempotency::Open({.claims = claims_.get(), .authenticate = auth, .group_committers = 0}),
                      "group_committers"));
  // Claims that keep nothing cannot be made (Claims::Open refuses them).
  EXPECT_EQ(Claims::Open(*store_->claim_store(), Claims::Options{.retention_ms = 0}).status().code(),
            Code::kInvalidArgument);
  // Routes: a kind's store is checked where the route is made.
  EXPECT_TRUE(refused(idem_->AddRoute("/x", http::RouteKind::kTransactional, {}), "store"));
  EXPECT_TRUE(refused(idem_->AddRoute("/x", http::RouteKind::kTwoPhase, {}, store_.get()), "store"));
  EXPECT_TRUE(refused(idem_->AddRoute("", http::RouteKind::kTwoPhase, {}), "name"));
  EXPECT_TRUE(refused(idem_->Wrap("/x", {.lease_ms = 0}, [](const Request&, Answer&) {}), "lease_ms"));
  EXPECT_TRUE(idem_->AddRoute("/x", http::RouteKind::kTransactional, {}, store_.get()).ok());
}

TEST_F(CoreTest, TwoPhaseRouteRunsOnceAndReplaysTheSameAnswer) {
  http::Handler charge = Charge();
  Answer first;
  charge(Post("k-1"), first);
  EXPECT_EQ(first.status, 201);
  EXPECT_EQ(first.headers.Get("location"), "/charges/ch_1");
  EXPECT_EQ(first.headers.Get("Idempotency-Key-Retention"), "86400");
  EXPECT_FALSE(first.headers.Has("Idempotent-Replayed"));
  Answer again;
  charge(Post("\"k-1\""), again);  // the quoted form is the same key
  EXPECT_EQ(again.status, 201);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(again.headers.Get("Location"), "/charges/ch_1");
  EXPECT_EQ(again.headers.Get("Content-Type"), "application/json");
  EXPECT_EQ(again.headers.Get("Idempotent-Replayed"), "true");
  EXPECT_EQ(executions_, 1);
  Answer other;
  charge(Post("k-1", R"({"amount":1})"), other);
  EXPECT_EQ(other.status, 422);
  EXPECT_EQ(other.headers.Get("Content-Type"), "application/problem+json");
  auto c = idem_->counters();
  EXPECT_EQ(c.executed, 1u);
  EXPECT_EQ(c.replayed, 1u);
  EXPECT_EQ(c.conflicts, 1u);
  EXPECT_NE(log_.find("POST /charges key=k-1 executed 201"), std::string::npos) << log_;
  EXPECT_NE(log_.find("POST /charges key=k-1 replayed 201"), std::string::npos) << log_;
  // The observer is told the same, per key.
  for (const auto& [kind, n] : {std::pair{EventKind::kClaimStarted, 1u}, std::pair{EventKind::kClaimCompleted, 1u},
                                std::pair{EventKind::kClaimReplayed, 1u}, std::pair{EventKind::kClaimConflict, 1u}}) {
    ASSERT_EQ(told_.Of(kind).size(), n) << EventKindName(kind);
    EXPECT_EQ(told_.Of(kind)[0].id, "k-1");
  }
}

TEST_F(CoreTest, RefusalsBeforeAnyClaim) {
  http::Handler charge = Charge();
  Answer a;
  charge(Post("k-2", kBody, "sk_nobody"), a);
  EXPECT_EQ(a.status, 401);
  Answer b;
  charge(Post(""), b);
  EXPECT_EQ(b.status, 400);
  Request two = Post("k-2");
  two.headers.Add("idempotency-key", "k-3");
  Answer c;
  charge(two, c);
  EXPECT_EQ(c.status, 400);
  Answer d;
  charge(Post("has space"), d);
  EXPECT_EQ(d.status, 400);
  Answer e;
  Request get = Post("");
  get.method = "GET";  // not a guarded method: straight to the handler
  charge(get, e);
  EXPECT_EQ(e.status, 201);
  EXPECT_FALSE(e.headers.Has("Idempotency-Key-Retention"));
  EXPECT_EQ(executions_, 1);
  EXPECT_EQ(idem_->counters().rejected, 4u);
  // A key in a log line is one token, whatever it holds.
  Answer f;
  charge(Post("\"x \\\" 1\""), f);
  EXPECT_NE(log_.find("key=\"x \\x22 1\" executed 201"), std::string::npos) << log_;
}

// Found by fuzz/middleware_fuzz.cc: a NUL in the path was logged raw (it
// counted as one of the plain characters), and so was the method.
TEST_F(CoreTest, ALogLineQuotesAPathOrMethodWithANul) {
  auto charge = Charge();
  Request req = Post("k-nul");
  req.path = std::string("/charges\0x", 10);
  Answer a;
  charge(req, a);
  EXPECT_EQ(a.status, 201);
  EXPECT_NE(log_.find("POST \"/charges\\x00x\" key=k-nul executed 201"), std::string::npos) << log_;
  req.method = std::string("PO\0ST", 5);
  Answer b;
  charge(req, b);
  EXPECT_EQ(log_.find('\0'), std::string::npos) << Printable(log_, log_.size());
}

// Found by fuzz/middleware_fuzz.cc: a handler that threw on a request the
// middleware does not guard (here a GET) escaped Serve instead of being a 500.
TEST_F(CoreTest, AnUnguardedHandlerThatThrowsIsA500) {
  auto thrower = [](const Request&, Answer&) { throw std::runtime_error("boom"); };
  auto two_phase = idem_->Wrap("/two-phase", {}, thrower);
  ASSERT_OK(two_phase);
  auto tx = idem_->WrapInTransaction("/tx", {}, *store_, [](const Request&, Answer&, Transaction& t) {
    ASSERT_TRUE(t.Exec("INSERT INTO effects(k) VALUES ('thrown')", {}).ok());
    throw std::runtime_error("boom");
  });
  ASSERT_OK(tx);
  for (const http::Handler* route : {&*two_phase, &*tx}) {
    Request get = Post("");
    get.method = "GET";
    Answer a;
    EXPECT_NO_THROW((*route)(get, a));
    EXPECT_EQ(a.status, 500);
    EXPECT_NE(a.body.find("the handler threw: boom"), std::string::npos) << a.body;
  }
  auto t = store_->Begin();
  ASSERT_TRUE(t.ok());
  auto rows = (*t)->Query("SELECT count(*) FROM effects", {});
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->rows[0][0].AsInt(), 0) << "the thrown transaction was rolled back";
}

TEST_F(CoreTest, TransactionalRouteCommitsTheEffectWithTheKey) {
  auto route = idem_->WrapInTransaction("/charges", {}, *store_, [this](const Request&, Answer& ans, Transaction& tx) {
    ++executions_;
    Value row[] = {std::string("e")};
    ASSERT_TRUE(tx.Exec("INSERT INTO effects(k) VALUES ($1)", row).ok());
    ans.status = executions_ == 1 ? 400 : 201;  // the first: a 4xx, rolled back with the key
  });
  ASSERT_OK(route);
  auto effects = [&] {
    auto tx = store_->Begin();
    auto rows = (*tx)->Query("SELECT count(*) FROM effects", {});
    return rows.ok() ? rows->rows[0][0].AsInt() : -1;
  };
  Answer refused;
  (*route)(Post("t-1"), refused);
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(effects(), 0);
  Answer done;
  (*route)(Post("t-1"), done);
  EXPECT_EQ(done.status, 201);
  Answer replay;
  (*route)(Post("t-1"), replay);
  EXPECT_EQ(replay.status, 201);
  EXPECT_EQ(replay.headers.Get("Idempotent-Replayed"), "true");
  EXPECT_EQ(effects(), 1);
  EXPECT_EQ(executions_, 2);
}

// An adapter's way: a route made once, a handler given per request (over
// the framework's own types, here a plain struct), a validator per request.
TEST_F(CoreTest, ServeWithAPerRequestHandlerAndValidator) {
  auto route = idem_->AddRoute("/charges", http::RouteKind::kTwoPhase, {});
  ASSERT_OK(route);
  struct NativeRequest {
    std::string body;
  } native{kBody};
  const Idempotency::Work work = [&](const Request&, Answer& ans, Transaction* tx) {
    EXPECT_EQ(tx, nullptr);  // two-phase: no transaction
    EXPECT_NE(http::CurrentClaim(), nullptr);
    ++executions_;
    ans.status = 201;
    ans.body = native.body;
  };
  const http::Validator refuse_all = [](const Request&, Answer& ans) {
    ans.status = 402;
    return false;
  };
  Answer refused;
  idem_->Serve(**route, Post("s-1"), refused, work, refuse_all);
  EXPECT_EQ(refused.status, 402);
  EXPECT_EQ(executions_, 0);
  EXPECT_EQ(idem_->counters().invalid, 1u);
  Answer ran;
  idem_->Serve(**route, Post("s-1"), ran, work);
  EXPECT_EQ(ran.status, 201);
  EXPECT_EQ(ran.body, kBody);
  EXPECT_EQ(http::CurrentClaim(), nullptr);
  EXPECT_EQ(executions_, 1);
}

TEST_F(CoreTest, AHandlerThatThrowsIsA500AndTheKeyStaysFree) {
  int calls = 0;
  auto route = idem_->Wrap("/charges", {}, [&](const Request&, Answer& ans) {
    if (++calls == 1) throw std::runtime_error("bug");
    ans.status = 201;
  });
  ASSERT_TRUE(route.ok());
  Answer threw;
  (*route)(Post("h-1"), threw);
  EXPECT_EQ(threw.status, 500);
  EXPECT_NE(threw.body.find("the handler threw: bug"), std::string::npos) << threw.body;
  Answer retried;
  (*route)(Post("h-1"), retried);
  EXPECT_EQ(retried.status, 201);
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace idem::testing
