// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::http::Idempotency on a real ::httplib::Server over loopback, its claims
// in a SQLite store whose clock is a FakeEnv (leases expire when the test
// advances it). Handlers that must be "still running" block on a Gate the
// test opens; nothing sleeps. Every key is sent at least twice.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/http_test_util.h"
#include "idem/http/idempotency.h"
#include "idem/http/stored_response.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using http::Idempotency;
using http::RoutePolicy;

constexpr char kBody[] = R"({"amount":4000,"currency":"usd","customer":"cus_1"})";

class IdempotencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s =
        sqlite::Store::Open({.path = dir_.File("idem.db"), .synchronous = sqlite::Synchronous::kNormal, .env = &env_});
    ASSERT_OK(s);
    store_ = std::move(*s);
    ASSERT_NE(store_->claim_store(), nullptr);
    observed_ = std::make_unique<ObservedClaimStore>(*store_->claim_store());
    claims_ = std::make_unique<Claims>(*observed_);
  }
  void TearDown() override { server_.Stop(); }

  // The middleware (principals acct_a and acct_b); call before Route().
  void Middleware(http::Idempotency::Options options = {}) {
    if (options.env == nullptr) options.env = &env_;
    idem_ = OpenMiddleware(*claims_, http::BearerKeys({{"sk_a", "acct_a"}, {"sk_b", "acct_b"}}), options);
  }
  // POST (and PATCH) `route` through the middleware to `handler`.
  void Route(const std::string& route, RoutePolicy policy, ::httplib::Server::Handler handler,
             idem::httplib::Validator validate = nullptr) {
    if (!idem_) Middleware();
    auto wrapped = Must(idem::httplib::Wrap(*idem_, route, std::move(policy), std::move(handler), std::move(validate)));
    server_.server().Post(route, wrapped);
    server_.server().Patch(route, wrapped);
    server_.server().Put(route, wrapped);
  }
  // The usual handler: a "charge" per execution, 201 with Location.
  ::httplib::Server::Handler ChargeHandler() {
    return [this](const ::httplib::Request& req, ::httplib::Response& res) {
      const int n = ++executions_;
      res.status = 201;
      res.set_header("Location", "/charges/ch_" + std::to_string(n));
      res.set_header("X-Execution", std::to_string(n));
      nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
      res.set_content(nlohmann::json{{"id", "ch_" + std::to_string(n)}, {"execution", n}, {"request", body}}.dump(),
                      "application/json");
    };
  }
  void Start() { server_.Start(); }

  Reply Post(const std::string& raw_key, const std::string& body = kBody, const std::string& bearer = "sk_a",
             const std::string& path = "/charges") {
    return Send(server_.port(), "POST", path, Headers(bearer, raw_key), body);
  }
  Reply PostKey(const std::string& key, const std::string& body = kBody, const std::string& bearer = "sk_a") {
    return Post(Quoted(key), body, bearer);
  }

  // A problem+json body with the type and retry advice.
  static void ExpectProblem(const Reply& r, int status, const std::string& type, const std::string& retry) {
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_EQ(r.header("Content-Type"), "application/problem+json");
    auto j = r.json();
    ASSERT_TRUE(j.is_object()) << r.body;
    EXPECT_EQ(j.value("type", ""), "https://idem.dev/problems/" + type) << r.body;
    EXPECT_EQ(j.value("retry", ""), retry) << r.body;
    EXPECT_EQ(j.value("status", 0), status) << r.body;
    EXPECT_FALSE(j.value("title", "").empty()) << r.body;
    EXPECT_FALSE(j.value("detail", "").empty()) << r.body;
    EXPECT_EQ(r.header("Idempotency-Key-Retention"), "86400");
    EXPECT_FALSE(r.replayed());
  }

  TempDir dir_;
  FakeEnv env_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<ObservedClaimStore> observed_;
  std::unique_ptr<Claims> claims_;
  std::unique_ptr<Idempotency> idem_;
  LoopbackServer server_;
  std::atomic<int> executions_{0};
};

TEST_F(IdempotencyTest, ReplayIsByteIdenticalWithIdempotentReplayed) {
  Route("/charges", {}, [&](const ::httplib::Request&, ::httplib::Response& res) {
    const int n = ++executions_;
    res.status = 201;
    res.set_header("Location", "/charges/ch_" + std::to_string(n));
    res.set_header("X-Request-Id", "req_" + std::to_string(n));
    // Bytes a re-serialisation would change: spacing, key order, escapes, NUL.
    res.set_content(std::string("{ \"z\": 1,  \"a\" : \"\\u00e9\" }\n\0end", 32), "application/json; charset=utf-8");
  });
  Start();
  Reply first = PostKey("replay-1");
  ASSERT_TRUE(first.ok) << first.error;
  EXPECT_EQ(first.status, 201);
  EXPECT_EQ(first.body, std::string("{ \"z\": 1,  \"a\" : \"\\u00e9\" }\n\0end", 32));
  EXPECT_EQ(first.header("Location"), "/charges/ch_1");
  EXPECT_EQ(first.header("Content-Type"), "application/json; charset=utf-8");
  EXPECT_FALSE(first.has("Idempotent-Replayed"));
  EXPECT_EQ(first.header("Idempotency-Key-Retention"), "86400");
  for (int i = 0; i < 3; ++i) {
    Reply again = PostKey("replay-1");
    ASSERT_TRUE(again.ok) << again.error;
    ExpectSameResponse(first, again);
    EXPECT_EQ(again.header("X-Request-Id"), "req_1");
    EXPECT_EQ(again.header("Idempotent-Replayed"), "true");
    EXPECT_EQ(again.header("Idempotency-Key-Retention"), "86400");
    // One of each: the stored headers do not pile up on replays.
    EXPECT_EQ(again.headers.count("Location"), 1u);
    EXPECT_EQ(again.headers.count("Idempotent-Replayed"), 1u);
    EXPECT_EQ(again.headers.count("Idempotency-Key-Retention"), 1u);
  }
  auto c = idem_->counters();
  EXPECT_EQ(c.executed, 1u);
  EXPECT_EQ(c.replayed, 3u);
}

// The header says how long the store keeps the response, and it does: the
// Claims' retention is the one setting for both.
TEST_F(IdempotencyTest, RetentionHeaderSaysHowLongTheResponseIsKept) {
  constexpr int64_t kWeekMs = 7LL * 24 * 3600 * 1000;
  claims_ = MustOpen<Claims>(*observed_, Claims::Options{.retention_ms = kWeekMs});
  Middleware();
  Route("/charges", {}, ChargeHandler());
  Start();
  Reply first = PostKey("ret-1");
  Reply again = PostKey("ret-1");
  EXPECT_EQ(first.header("Idempotency-Key-Retention"), "604800");
  EXPECT_EQ(again.header("Idempotency-Key-Retention"), "604800");
  EXPECT_TRUE(again.replayed());
  Reply missing = Post("\"\"", kBody);  // an empty key
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(missing.header("Idempotency-Key-Retention"), "604800");

  env_.Advance(kWeekMs - 1'000);  // past the default 24 h, within the week: still replayed
  Reply late = PostKey("ret-1");
  EXPECT_TRUE(late.replayed());
  EXPECT_EQ(late.body, first.body);
  EXPECT_EQ(executions_, 1);
  env_.Advance(2'000);  // past the week: the key is free again and runs anew
  Reply expired = PostKey("ret-1");
  EXPECT_EQ(expired.status, 201);
  EXPECT_FALSE(expired.replayed());
  EXPECT_EQ(executions_, 2);
}

// Set-up mistakes fail at start-up, not as a 5xx (or a second execution)
// on every request.
TEST_F(IdempotencyTest, SetUpMistakesFailAtStartUp) {
  auto refused = [](const auto& r) { return !r.ok() && r.status().code() == Code::kInvalidArgument; };
  // Claims that keep nothing cannot be made (Claims::Open refuses them).
  EXPECT_EQ(Claims::Open(*observed_, Claims::Options{.retention_ms = 0}).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(refused(Idempotency::Open({.claims = claims_.get(), .authenticate = http::Authenticator{}})));
  EXPECT_TRUE(refused(Idempotency::Open({.authenticate = http::BearerKeys({{"sk_a", "acct_a"}})})));
  Middleware();
  EXPECT_TRUE(refused(idem::httplib::Wrap(*idem_, "", {}, ChargeHandler())));
  EXPECT_TRUE(refused(idem::httplib::WrapInTransaction(
      *idem_, "", {}, *store_, [](const ::httplib::Request&, ::httplib::Response&, Transaction&) {})));
  EXPECT_TRUE(refused(idem::httplib::Wrap(*idem_, "/charges", {.lease_ms = 0}, ChargeHandler())));
  EXPECT_TRUE(refused(idem::httplib::Wrap(*idem_, "/charges", {.wait_ms = -5}, ChargeHandler())));
  EXPECT_TRUE(idem::httplib::Wrap(*idem_, "/charges", {}, ChargeHandler()).ok());
}

TEST_F(IdempotencyTest, NoOrUnknownBearerIs401) {
  Route("/charges", {}, ChargeHandler());
  Start();
  for (int i = 0; i < 2; ++i) {
    ExpectProblem(PostKey("auth-1", kBody, /*bearer=*/""), 401, "unauthenticated", "no");
    ExpectProblem(PostKey("auth-1", kBody, "sk_unknown"), 401, "unauthenticated", "no");
    ExpectProblem(Send(server_.port(), "POST", "/charges",
                       {{"Authorization", "Basic c2tfYTo="}, {"Idempotency-Key", "\"auth-1\""}}, kBody),
                  401, "unauthenticated", "no");
    ExpectProblem(Send(server_.port(), "POST", "/charges",
                       {{"Authorization", "Bearer "}, {"Idempotency-Key", "\"auth-1\""}}, kBody),
                  401, "unauthenticated", "no");
  }
  EXPECT_EQ(executions_.load(), 0);
  // The key was never claimed: the authenticated request runs it.
  EXPECT_EQ(PostKey("auth-1").status, 201);
  EXPECT_TRUE(PostKey("auth-1").replayed());
  EXPECT_EQ(executions_.load(), 1);
  EXPECT_EQ(idem_->counters().rejected, 8u);
}

TEST_F(IdempotencyTest, BodyOverMaxBodyBytesIs413) {
  Middleware({.max_body_bytes = 32});
  Route("/charges", {}, ChargeHandler());
  Start();
  const std::string at_limit = R"({"amount":4000,"currency":"usd"})";  // 32 bytes
  ASSERT_EQ(at_limit.size(), 32u);
  const std::string over = R"({"amount":40000,"currency":"usd"})";  // 33 bytes
  for (int i = 0; i < 2; ++i) ExpectProblem(PostKey("big-1", over), 413, "body-too-large", "new-key");
  EXPECT_EQ(executions_.load(), 0);
  Reply ok = PostKey("small-1", at_limit);
  EXPECT_EQ(ok.status, 201);
  EXPECT_TRUE(PostKey("small-1", at_limit).replayed());
  EXPECT_EQ(executions_.load(), 1);
}

TEST_F(IdempotencyTest, MissingOrMalformedKeyIs400) {
  Route("/charges", {}, ChargeHandler());
  Start();
  struct Case {
    std::string name;
    ::httplib::Headers headers;
    std::string type;
  };
  const ::httplib::Headers auth = {{"Authorization", "Bearer sk_a"}};
  auto with = [&](std::vector<std::string> values) {
    ::httplib::Headers h = auth;
    for (auto& v : values) h.emplace("Idempotency-Key", v);
    return h;
  };
  const std::vector<Case> cases = {
      {"missing", auth, "idempotency-key-missing"},
      // cpp-httplib's server drops a header field with an empty value: the
      // middleware sees no key at all.
      {"empty header value", with({""}), "idempotency-key-missing"},
      {"empty string", with({"\"\""}), "idempotency-key-malformed"},
      {"256 characters", with({"\"" + std::string(256, 'k') + "\""}), "idempotency-key-malformed"},
      {"unquoted with a space", with({"8e03978e 40d5"}), "idempotency-key-malformed"},
      {"unquoted list", with({"k1,k2"}), "idempotency-key-malformed"},
      {"unquoted with a backslash", with({"k\\1"}), "idempotency-key-malformed"},
      {"unterminated quote", with({"\"k1"}), "idempotency-key-malformed"},
      {"control byte", with({"\"k\x01\""}), "idempotency-key-malformed"},
      {"256 characters unquoted", with({std::string(256, 'k')}), "idempotency-key-malformed"},
      {"bad escape", with({R"("a\x")"}), "idempotency-key-malformed"},
      {"escaped closing quote", with({R"("abc\")"}), "idempotency-key-malformed"},
      {"non-ASCII", with({"\"caf\xc3\xa9\""}), "idempotency-key-malformed"},
      {"two headers", with({"\"k1\"", "\"k2\""}), "idempotency-key-malformed"},
      {"two equal headers", with({"\"k1\"", "\"k1\""}), "idempotency-key-malformed"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    for (int i = 0; i < 2; ++i) {
      Reply r = Send(server_.port(), "POST", "/charges", c.headers, kBody);
      ExpectProblem(r, 400, c.type, "new-key");
    }
  }
  EXPECT_EQ(executions_.load(), 0);
  EXPECT_EQ(idem_->counters().rejected, 2 * cases.size());
  // The longest key there may be works, and replays.
  const std::string longest(255, 'k');
  EXPECT_EQ(PostKey(longest).status, 201);
  EXPECT_TRUE(PostKey(longest).replayed());
  // k1 and k2 were never claimed by the two-header requests.
  EXPECT_EQ(PostKey("k1").header("X-Execution"), "2");
  EXPECT_EQ(PostKey("k2").header("X-Execution"), "3");
  EXPECT_TRUE(PostKey("k1").replayed());
  EXPECT_TRUE(PostKey("k2").replayed());
  EXPECT_EQ(executions_.load(), 3);
}

// Stripe's client libraries send the key bare; the key is the unescaped
// text, so a bare key and its quoted form are one key and replay each other.
TEST_F(IdempotencyTest, ABareKeyAndItsQuotedFormAreOneKey) {
  Route("/charges", {}, ChargeHandler());
  Start();
  Reply bare = Post("abc");
  ASSERT_TRUE(bare.ok) << bare.error;
  EXPECT_EQ(bare.status, 201) << bare.body;
  EXPECT_FALSE(bare.replayed());
  Reply quoted = Post("\"abc\"");
  EXPECT_EQ(quoted.status, 201) << quoted.body;
  EXPECT_TRUE(quoted.replayed());
  ExpectSameResponse(bare, quoted);
  // And the other way round, with a UUID-like and a message-derived key.
  for (const char* key : {"8e2b91c4-5f0e-4c2a-9d41-7a3b2c1d0e9f", "m-7f3:charge"}) {
    SCOPED_TRACE(key);
    Reply first = Post(Quoted(key));
    EXPECT_EQ(first.status, 201) << first.body;
    EXPECT_FALSE(first.replayed());
    Reply again = Post(" " + std::string(key) + "\t");
    EXPECT_EQ(again.status, 201) << again.body;
    EXPECT_TRUE(again.replayed());
    ExpectSameResponse(first, again);
  }
  EXPECT_EQ(executions_.load(), 3);
}

TEST_F(IdempotencyTest, SameKeyDifferentBodyIs422) {
  Route("/charges", {}, ChargeHandler());
  Route("/refunds", {}, ChargeHandler());
  Start();
  Reply first = PostKey("reuse-1");
  ASSERT_EQ(first.status, 201);
  for (int i = 0; i < 2; ++i) {
    ExpectProblem(PostKey("reuse-1", R"({"amount":5000,"currency":"usd","customer":"cus_1"})"), 422,
                  "idempotency-key-reused", "new-key");
    ExpectProblem(PostKey("reuse-1", "amount=4000"), 422, "idempotency-key-reused", "new-key");
  }
  // PATCH is another request (method), and so is another route: their own scope.
  for (int i = 0; i < 2; ++i) {
    Reply patch = Send(server_.port(), "PATCH", "/charges", Headers("sk_a", "\"reuse-1\""), kBody);
    EXPECT_EQ(patch.status, 201);
    EXPECT_EQ(patch.replayed(), i == 1);
    Reply refund = Post("\"reuse-1\"", kBody, "sk_a", "/refunds");
    EXPECT_EQ(refund.status, 201);
    EXPECT_EQ(refund.replayed(), i == 1);
  }
  // The original request still replays.
  Reply again = PostKey("reuse-1");
  EXPECT_TRUE(again.replayed());
  ExpectSameResponse(first, again);
  EXPECT_EQ(executions_.load(), 3);
  EXPECT_EQ(idem_->counters().conflicts, 4u);
}

TEST_F(IdempotencyTest, WhileTheFirstRunsASecondGets409WithRetryAfter) {
  Gate gate;
  auto charge = ChargeHandler();
  Route("/charges", {}, [&](const ::httplib::Request& req, ::httplib::Response& res) {
    if (executions_.load() == 0) gate.Arrive();
    charge(req, res);
  });
  Start();
  Reply first;
  std::thread t([&] { first = PostKey("busy-1"); });
  gate.WaitArrived();
  for (int i = 0; i < 2; ++i) {
    Reply busy = PostKey("busy-1");
    ExpectProblem(busy, 409, "request-in-progress", "same-key");
    // The lease (30 s, RoutePolicy's default) ends 30 s from now on the store's clock.
    EXPECT_EQ(busy.header("Retry-After"), "30");
  }
  // Another body with the key is a conflict even while the first runs.
  ExpectProblem(PostKey("busy-1", R"({"amount":1})"), 422, "idempotency-key-reused", "new-key");
  env_.Advance(12'500);
  EXPECT_EQ(PostKey("busy-1").header("Retry-After"), "18");  // rounded up
  gate.Open();
  t.join();
  ASSERT_TRUE(first.ok) << first.error;
  EXPECT_EQ(first.status, 201);
  EXPECT_FALSE(first.replayed());
  Reply again = PostKey("busy-1");
  EXPECT_TRUE(again.replayed());
  ExpectSameResponse(first, again);
  EXPECT_EQ(executions_.load(), 1);
  EXPECT_EQ(idem_->counters().in_progress, 3u);
}

// RoutePolicy::refusals: the same decisions in the shape Stripe's clients
// parse; other routes keep problem+json.
TEST_F(IdempotencyTest, StripeErrorsShapeTheRefusalsOfTheirRoute) {
  Gate gate;
  auto charge = ChargeHandler();
  Route("/v1/charges", {.refusals = http::StripeErrors()},
        [&](const ::httplib::Request& req, ::httplib::Response& res) {
          if (req.body == "busy=1") gate.Arrive();
          charge(req, res);
        });
  Route("/charges", {}, ChargeHandler());
  Start();
  auto stripe_error = [](const Reply& r, int status, const std::string& type, const std::string& should_retry) {
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_EQ(r.header("Content-Type"), "application/json");
    auto j = r.json();
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_EQ(j["error"].value("type", ""), type) << r.body;
    EXPECT_FALSE(j["error"].value("message", "").empty()) << r.body;
    EXPECT_EQ(r.header("Stripe-Should-Retry"), should_retry) << r.body;
    EXPECT_EQ(r.header("Idempotency-Key-Retention"), "86400");
  };
  auto post = [&](const std::string& key, const std::string& body, const std::string& bearer = "sk_a") {
    return Send(server_.port(), "POST", "/v1/charges", Headers(bearer, key), body);
  };
  ASSERT_EQ(post("s-1", "amount=1").status, 201);
  // A reused key: 400 idempotency_error (Stripe's status and type), counted as a conflict.
  for (int i = 0; i < 2; ++i) stripe_error(post("s-1", "amount=2"), 400, "idempotency_error", "false");
  EXPECT_EQ(idem_->counters().conflicts, 2u);
  stripe_error(post("s-2", "amount=1", "sk_wrong"), 401, "invalid_request_error", "false");
  stripe_error(post("\"unterminated", "amount=1"), 400, "invalid_request_error", "false");
  // In progress: 409 with the code Stripe uses, and a retry the clients make.
  std::thread t([&] { (void)post("s-busy", "busy=1"); });
  gate.WaitArrived();
  Reply busy = post("s-busy", "busy=1");
  stripe_error(busy, 409, "invalid_request_error", "true");
  EXPECT_EQ(busy.json()["error"].value("code", ""), "idempotency_key_in_use");
  EXPECT_EQ(busy.header("Retry-After"), "30");
  gate.Open();
  t.join();
  // The other route keeps the problem+json shape.
  ASSERT_EQ(PostKey("p-1").status, 201);
  ExpectProblem(PostKey("p-1", R"({"amount":1})"), 422, "idempotency-key-reused", "new-key");
}

TEST_F(IdempotencyTest, BoundedWaitAnswersWithTheFirstResultInsteadOf409) {
  Gate gate;
  Latch waiting(1);
  observed_->on_try = [&](const ClaimRequest&, const Result<ClaimOutcome>& r) {
    if (r.ok() && r->kind == ClaimOutcome::Kind::kInProgress) waiting.CountDown();
  };
  auto charge = ChargeHandler();
  Route("/charges", {.wait_ms = 600'000}, [&](const ::httplib::Request& req, ::httplib::Response& res) {
    if (executions_.load() == 0) gate.Arrive();
    charge(req, res);
  });
  Start();
  Reply first, second;
  std::thread t1([&] { first = PostKey("wait-1"); });
  gate.WaitArrived();
  std::thread t2([&] { second = PostKey("wait-1"); });
  waiting.Wait();  // the second found the key in progress and waits for it
  gate.Open();
  t1.join();
  t2.join();
  ASSERT_TRUE(first.ok && second.ok) << first.error << second.error;
  EXPECT_EQ(first.status, 201);
  EXPECT_FALSE(first.replayed());
  EXPECT_TRUE(second.replayed());
  ExpectSameResponse(first, second);
  EXPECT_EQ(PostKey("wait-1").body, first.body);
  EXPECT_EQ(executions_.load(), 1);
  EXPECT_EQ(idem_->counters().in_progress, 0u);
}

TEST_F(IdempotencyTest, TooManyKeysPerPrincipalIs429) {
  Middleware({.max_keys_per_principal = 2});
  Route("/charges", {}, ChargeHandler());
  Start();
  Reply k1 = PostKey("lim-1");
  EXPECT_EQ(k1.status, 201) << k1.body;
  Reply k2 = PostKey("lim-2");
  EXPECT_EQ(k2.status, 201) << k2.body;
  for (int i = 0; i < 2; ++i) {
    Reply k3 = PostKey("lim-3");
    ExpectProblem(k3, 429, "too-many-keys", "same-key");
    EXPECT_EQ(k3.header("Retry-After"), "60");
  }
  // Stored keys still replay; another principal has its own count.
  EXPECT_TRUE(PostKey("lim-1").replayed());
  EXPECT_TRUE(PostKey("lim-2").replayed());
  EXPECT_EQ(PostKey("lim-1", kBody, "sk_b").status, 201);
  EXPECT_TRUE(PostKey("lim-1", kBody, "sk_b").replayed());
  // Counted again from the store a second later: still two stored keys.
  env_.Advance(1'001);
  ExpectProblem(PostKey("lim-3"), 429, "too-many-keys", "same-key");
  EXPECT_EQ(executions_.load(), 3);
  // A refused key was released, not left in progress.
  auto rec = store_->claim_store()->FindClaim("acct_a|POST /charges", "lim-3");
  ASSERT_OK(rec);
  EXPECT_FALSE(rec->has_value());
}

TEST_F(IdempotencyTest, TooManyKeysCountsWhatTheStoreAlreadyHolds) {
  // Keys stored before this middleware existed (another process, a restart).
  for (const char* key : {"old-1", "old-2"}) {
    auto c = claims_->Claim({.scope = "acct_a|POST /charges", .key = key, .fingerprint = FingerprintOf(key)});
    ASSERT_OK(c);
    ASSERT_TRUE(claims_->Complete(c->token, "x").ok());
  }
  Middleware({.max_keys_per_principal = 3});
  Route("/charges", {}, ChargeHandler());
  Start();
  EXPECT_EQ(PostKey("new-1").status, 201);
  EXPECT_TRUE(PostKey("new-1").replayed());
  for (int i = 0; i < 2; ++i) ExpectProblem(PostKey("new-2"), 429, "too-many-keys", "same-key");
  EXPECT_EQ(executions_.load(), 1);
}

TEST_F(IdempotencyTest, NoLimitOnKeysCountsNothing) {
  std::atomic<int> counts{0};
  observed_->on_count = [&](std::string_view) { ++counts; };
  Middleware({.max_keys_per_principal = 0});
  Route("/charges", {}, ChargeHandler());
  Start();
  for (int i = 0; i < 5; ++i) {
    const std::string key = "nolimit-" + std::to_string(i);
    EXPECT_EQ(PostKey(key).status, 201) << key;
    env_.Advance(1'001);  // a count would be stale each time
    EXPECT_TRUE(PostKey(key).replayed()) << key;
  }
  EXPECT_EQ(counts.load(), 0);
  EXPECT_EQ(executions_.load(), 5);
}

TEST_F(IdempotencyTest, OneRequestAtATimeRecountsAPrincipalsKeys) {
  // While one request counts the principal's stored keys (a count over
  // every key it holds, slow under load), the requests that arrive meanwhile
  // answer from the last count instead of each counting too.
  std::mutex mu;
  std::condition_variable cv;
  int counts = 0;
  bool hold = false, held = false;
  observed_->on_count = [&](std::string_view) {
    std::unique_lock lock(mu);
    ++counts;
    if (!hold) return;
    hold = false;
    held = true;
    cv.notify_all();
    cv.wait(lock, [&] { return !held; });
  };
  Middleware({.max_keys_per_principal = 100});
  Route("/charges", {}, ChargeHandler());
  Start();
  EXPECT_EQ(PostKey("recount-1").status, 201);
  env_.Advance(1'001);  // the count is stale: the next request counts again
  {
    std::lock_guard lock(mu);  // written by the server's threads: read under the lock
    EXPECT_EQ(counts, 1);
    hold = true;
  }
  Reply counting;
  std::thread t([&] { counting = PostKey("recount-2"); });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return held; });
  }
  for (const char* key : {"recount-3", "recount-4", "recount-5"}) {
    Reply r = PostKey(key);
    EXPECT_EQ(r.status, 201) << key << r.body;
    EXPECT_FALSE(r.replayed());
  }
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(counts, 2);  // only the held request's count
    held = false;
  }
  cv.notify_all();
  t.join();
  EXPECT_EQ(counting.status, 201) << counting.body;
  for (const char* key : {"recount-1", "recount-2", "recount-5"}) EXPECT_TRUE(PostKey(key).replayed()) << key;
  EXPECT_EQ(executions_.load(), 5);
}

TEST_F(IdempotencyTest, MethodsNotInThePolicyPassThrough) {
  Route("/charges", {}, ChargeHandler());  // POST and PATCH guarded; PUT is routed too
  Start();
  for (int i = 0; i < 2; ++i) {
    // No principal, no key, or a malformed one: the middleware does not look.
    Reply put = Send(server_.port(), "PUT", "/charges", {}, kBody);
    EXPECT_EQ(put.status, 201);
    EXPECT_FALSE(put.has("Idempotent-Replayed"));
    EXPECT_FALSE(put.has("Idempotency-Key-Retention"));
    Reply put_key = Send(server_.port(), "PUT", "/charges", Headers("sk_a", "\"put-1\""), kBody);
    EXPECT_EQ(put_key.status, 201);
    EXPECT_FALSE(put_key.replayed());
    Reply put_bad = Send(server_.port(), "PUT", "/charges", Headers("", "not quoted"), kBody);
    EXPECT_EQ(put_bad.status, 201);
  }
  EXPECT_EQ(executions_.load(), 6);
  // A policy of PUT only: POST passes through, PUT is guarded.
  idem_.reset();
  LoopbackServer other;
  Middleware();
  auto wrapped = Must(idem::httplib::Wrap(*idem_, "/items", {.methods = {"PUT"}}, ChargeHandler()));
  other.server().Post("/items", wrapped);
  other.server().Put("/items", wrapped);
  other.Start();
  for (int i = 0; i < 2; ++i) EXPECT_EQ(Send(other.port(), "POST", "/items", {}, kBody).status, 201);
  EXPECT_EQ(Send(other.port(), "PUT", "/items", Headers("sk_a", "\"put-2\""), kBody).status, 201);
  EXPECT_TRUE(Send(other.port(), "PUT", "/items", Headers("sk_a", "\"put-2\""), kBody).replayed());
  ExpectProblem(Send(other.port(), "PUT", "/items", Headers("sk_a", std::nullopt), kBody), 400,
                "idempotency-key-missing", "new-key");
  EXPECT_EQ(executions_.load(), 9);
}

TEST_F(IdempotencyTest, RequireKeyFalseRunsUnguardedWithoutAKey) {
  Route("/charges", {.require_key = false}, ChargeHandler());
  Start();
  Reply a = Post("\"\"", kBody);  // a key sent must be valid, even where none is required
  EXPECT_EQ(a.status, 400);
  const ::httplib::Headers auth = {{"Authorization", "Bearer sk_a"}};
  Reply r1 = Send(server_.port(), "POST", "/charges", auth, kBody);
  Reply r2 = Send(server_.port(), "POST", "/charges", auth, kBody);
  EXPECT_EQ(r1.status, 201);
  EXPECT_EQ(r2.status, 201);
  EXPECT_FALSE(r2.replayed());
  EXPECT_NE(r1.header("Location"), r2.header("Location"));  // two executions
  EXPECT_EQ(executions_.load(), 2);
  // Still authenticated.
  ExpectProblem(Send(server_.port(), "POST", "/charges", {}, kBody), 401, "unauthenticated", "no");
  // With a key it is guarded as usual.
  EXPECT_EQ(PostKey("opt-1").status, 201);
  EXPECT_TRUE(PostKey("opt-1").replayed());
  ExpectProblem(Post("bare token"), 400, "idempotency-key-malformed", "new-key");
  EXPECT_EQ(executions_.load(), 3);
}

TEST_F(IdempotencyTest, A5xxIsReleasedByDefaultSoTheRetryRunsAgain) {
  auto charge = ChargeHandler();
  Route("/charges", {}, [&](const ::httplib::Request& req, ::httplib::Response& res) {
    if (executions_.load() == 0) {
      ++executions_;
      res.status = 503;
      res.set_content("provider down", "text/plain");
      return;
    }
    charge(req, res);
  });
  Start();
  Reply r1 = PostKey("5xx-1");
  EXPECT_EQ(r1.status, 503);
  EXPECT_EQ(r1.body, "provider down");
  EXPECT_FALSE(r1.replayed());
  Reply r2 = PostKey("5xx-1");
  EXPECT_EQ(r2.status, 201);
  EXPECT_FALSE(r2.replayed());
  EXPECT_EQ(r2.header("X-Execution"), "2");
  Reply r3 = PostKey("5xx-1");
  EXPECT_TRUE(r3.replayed());
  ExpectSameResponse(r2, r3);
  EXPECT_EQ(executions_.load(), 2);
}

TEST_F(IdempotencyTest, A5xxIsStoredWithStore5xx) {
  Route("/charges", {.store_5xx = true}, [&](const ::httplib::Request&, ::httplib::Response& res) {
    ++executions_;
    res.status = 500;
    res.set_content(R"({"error":"ledger failed after the charge"})", "application/json");
  });
  Start();
  Reply r1 = PostKey("5xx-2");
  EXPECT_EQ(r1.status, 500);
  for (int i = 0; i < 2; ++i) {
    Reply again = PostKey("5xx-2");
    EXPECT_TRUE(again.replayed());
    ExpectSameResponse(r1, again);
  }
  EXPECT_EQ(executions_.load(), 1);
}

TEST_F(IdempotencyTest, A4xxFromTheHandlerIsReleasedUnlessListedInStored4xx) {
  auto charge = ChargeHandler();
  Route("/charges", {}, [&](const ::httplib::Request& req, ::httplib::Response& res) {
    if (executions_.load() == 0) {
      ++executions_;
      res.status = 400;
      res.set_content(R"({"error":"customer unknown"})", "application/json");
      return;
    }
    charge(req, res);
  });
  Route("/declines", {.stored_4xx = {402}}, [&](const ::httplib::Request&, ::httplib::Response& res) {
    ++executions_;
    res.status = 402;
    res.set_content(R"({"error":"card declined"})", "application/json");
  });
  Route("/validations", {.stored_4xx = {402}}, [&](const ::httplib::Request&, ::httplib::Response& res) {
    ++executions_;
    res.status = 404;
    res.set_content(R"({"error":"no such customer"})", "application/json");
  });
  Start();
  EXPECT_EQ(PostKey("4xx-1").status, 400);
  Reply ran = PostKey("4xx-1");
  EXPECT_EQ(ran.status, 201);
  EXPECT_FALSE(ran.replayed());
  EXPECT_TRUE(PostKey("4xx-1").replayed());
  EXPECT_EQ(executions_.load(), 2);

  Reply declined = Post("\"4xx-2\"", kBody, "sk_a", "/declines");
  EXPECT_EQ(declined.status, 402);
  EXPECT_FALSE(declined.replayed());
  Reply again = Post("\"4xx-2\"", kBody, "sk_a", "/declines");
  EXPECT_TRUE(again.replayed());
  ExpectSameResponse(declined, again);
  EXPECT_EQ(executions_.load(), 3);

  for (int i = 0; i < 2; ++i) {
    Reply v = Post("\"4xx-3\"", kBody, "sk_a", "/validations");
    EXPECT_EQ(v.status, 404);
    EXPECT_FALSE(v.replayed());
  }
  EXPECT_EQ(executions_.load(), 5);
}

// On a plain (two-phase) route too: a request validate refuses is answered
// before any claim; one refused without a 4xx of its own gets a 400
// problem; one whose validate throws, a 500. The handler never runs for
// them, and the key stays free.
TEST_F(IdempotencyTest, ValidateRefusesBeforeTheClaim) {
  RoutePolicy silent;
  silent.validate = [](const http::Request& req, http::Answer&) { return req.body == kBody; };  // the core's types
  Route("/silent", silent, ChargeHandler());                                                    // counts its executions
  // The adapter's validator, over cpp-httplib's types.
  Route(
      "/throwing", {}, [&](const ::httplib::Request&, ::httplib::Response&) { ++executions_; },
      [](const ::httplib::Request&, ::httplib::Response&) -> bool { throw std::runtime_error("bug"); });
  Start();
  for (int i = 0; i < 2; ++i) {
    Reply r = Post("\"val-1\"", R"({"amount":1})", "sk_a", "/silent");
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.json().value("type", ""), "https://idem.dev/problems/invalid-request") << r.body;
    EXPECT_EQ(r.json().value("retry", ""), "same-key") << r.body;
    Reply t = Post("\"val-2\"", kBody, "sk_a", "/throwing");
    EXPECT_EQ(t.status, 500) << t.body;
    EXPECT_NE(t.body.find("validate threw: bug"), std::string::npos) << t.body;
  }
  EXPECT_EQ(executions_.load(), 0);
  EXPECT_EQ(idem_->counters().invalid, 4u);
  Reply ok = Post("\"val-1\"", kBody, "sk_a", "/silent");  // the same key, now valid: not 422
  EXPECT_EQ(ok.status, 201) << ok.body;
  EXPECT_TRUE(Post("\"val-1\"", kBody, "sk_a", "/silent").replayed());
  EXPECT_EQ(executions_.load(), 1);
}

TEST_F(IdempotencyTest, AThrowingHandlerIs500AndReleased) {
  auto charge = ChargeHandler();
  Route("/charges", {}, [&](const ::httplib::Request& req, ::httplib::Response& res) {
    if (executions_.load() == 0) {
      ++executions_;
      res.set_header("Location", "/half-done");
      throw std::runtime_error("database went away");
    }
    charge(req, res);
  });
  Start();
  Reply r1 = PostKey("throw-1");
  ExpectProblem(r1, 500, "handler-failed", "same-key");
  EXPECT_NE(r1.json().value("detail", "").find("database went away"), std::string::npos);
  EXPECT_FALSE(r1.has("Location"));  // what the handler set before throwing is dropped
  Reply r2 = PostKey("throw-1");
  EXPECT_EQ(r2.status, 201);
  EXPECT_TRUE(PostKey("throw-1").replayed());
  EXPECT_EQ(executions_.load(), 2);
}

TEST_F(IdempotencyTest, AHundredConcurrentRequestsWithOneKeyExecuteOnce) {
  Route("/charges", {}, ChargeHandler());
  Start();
  constexpr int kThreads = 100;
  std::vector<Reply> replies(kThreads);
  Latch start(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ::httplib::Client c("127.0.0.1", server_.port());  // its own client
      c.set_connection_timeout(std::chrono::seconds(30));
      c.set_read_timeout(std::chrono::seconds(120));
      start.ArriveAndWait();
      replies[i] = ToReply(c.Post("/charges", Headers("sk_a", "\"burst-1\""), kBody, "application/json"));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(executions_.load(), 1);
  const Reply* first = nullptr;
  int executed = 0, replayed = 0, busy = 0;
  for (const Reply& r : replies) {
    ASSERT_TRUE(r.ok) << r.error;
    if (r.status == 201 && !r.replayed()) {
      ++executed;
      first = &r;
    }
  }
  ASSERT_EQ(executed, 1);
  for (const Reply& r : replies) {
    if (&r == first) continue;
    if (r.status == 409) {
      ++busy;
      EXPECT_EQ(r.json().value("retry", ""), "same-key");
      EXPECT_FALSE(r.header("Retry-After").empty());
      continue;
    }
    ++replayed;
    EXPECT_TRUE(r.replayed()) << r.status << " " << r.body;
    ExpectSameResponse(*first, r);
  }
  EXPECT_EQ(executed + replayed + busy, kThreads);
  Reply after = PostKey("burst-1");
  EXPECT_TRUE(after.replayed());
  ExpectSameResponse(*first, after);
  EXPECT_EQ(executions_.load(), 1);
  auto c = idem_->counters();
  EXPECT_EQ(c.executed, 1u);
  EXPECT_EQ(c.replayed, static_cast<uint64_t>(replayed + 1));
  EXPECT_EQ(c.in_progress, static_cast<uint64_t>(busy));
}

// The "provider" behind the lease tests: one charge per key (as a unique
// (principal, key) column would make it), whichever execution writes first.
// The test reads and destroys it under `mu` as well: the handlers that wrote
// it ran on server threads, and an answer over a socket is no happens-before
// edge ThreadSanitizer can see.
struct OneChargePerKey {
  std::mutex mu;
  std::map<std::string, std::string> charges;
  std::map<int, int64_t> fences;  // execution -> its claim's fencing token
  ~OneChargePerKey() { std::lock_guard lock(mu); }
};

// A "provider" handler: the first execution blocks on `gate` (after noting
// its fencing token), then each writes the one charge of its key if it is not
// there yet and answers with it.
::httplib::Server::Handler LeaseHandler(std::atomic<int>& executions, Gate& first_gate, Gate* second_gate,
                                        OneChargePerKey& provider) {
  return [&executions, &first_gate, second_gate, &provider](const ::httplib::Request&, ::httplib::Response& res) {
    const int n = ++executions;
    const ClaimToken* claim = http::CurrentClaim();
    ASSERT_NE(claim, nullptr);
    {
      std::lock_guard lock(provider.mu);
      provider.fences[n] = claim->fence;
    }
    if (n == 1) first_gate.Arrive();
    if (n == 2 && second_gate != nullptr) second_gate->Arrive();
    std::string charge;
    {
      std::lock_guard lock(provider.mu);
      charge = provider.charges.emplace(claim->key, "ch_by_execution_" + std::to_string(n)).first->second;
    }
    res.status = 201;
    res.set_header("Location", "/charges/" + charge);
    res.set_header("X-Execution", std::to_string(n));
    res.set_content(nlohmann::json{{"id", charge}, {"execution", n}}.dump(), "application/json");
  };
}

TEST_F(IdempotencyTest, AnExpiredLeaseIsTakenOverAndTheFirstAnswersWithTheStoredResponse) {
  Gate gate;
  OneChargePerKey provider;
  Route("/charges", {.lease_ms = 1'000}, LeaseHandler(executions_, gate, nullptr, provider));
  Start();
  Reply first;
  std::thread t([&] { first = PostKey("lease-1"); });
  gate.WaitArrived();
  // Still within the lease: in progress.
  EXPECT_EQ(PostKey("lease-1").status, 409);
  env_.Advance(1'001);  // the first request's lease runs out on the store's clock
  Reply second = PostKey("lease-1");
  ASSERT_TRUE(second.ok) << second.error;
  EXPECT_EQ(second.status, 201);
  EXPECT_FALSE(second.replayed());
  EXPECT_EQ(second.header("X-Execution"), "2");
  gate.Open();
  t.join();
  // The first request's Complete is refused (fenced); it answers with what
  // the request that took over stored.
  ASSERT_TRUE(first.ok) << first.error;
  EXPECT_EQ(first.status, 201);
  EXPECT_TRUE(first.replayed());
  EXPECT_EQ(first.header("X-Execution"), "2");
  ExpectSameResponse(second, first);
  Reply third = PostKey("lease-1");
  EXPECT_TRUE(third.replayed());
  ExpectSameResponse(second, third);
  std::lock_guard provider_lock(provider.mu);
  EXPECT_EQ(provider.charges.size(), 1u);
  EXPECT_EQ(provider.charges["lease-1"], "ch_by_execution_2");
  EXPECT_GT(provider.fences[2], provider.fences[1]);
  auto rec = store_->claim_store()->FindClaim("acct_a|POST /charges", "lease-1");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->state, ClaimRecord::State::kCompleted);
  EXPECT_EQ((*rec)->fence, provider.fences[2]);
  EXPECT_EQ(idem_->counters().executed, 2u);
}

TEST_F(IdempotencyTest, ALeaseLostBeforeTheTakeoverCompletesIs409LeaseLost) {
  Gate gate1, gate2;
  OneChargePerKey provider;
  Route("/charges", {.lease_ms = 1'000}, LeaseHandler(executions_, gate1, &gate2, provider));
  Start();
  Reply first, second;
  std::thread t1([&] { first = PostKey("lease-2"); });
  gate1.WaitArrived();
  env_.Advance(1'001);
  std::thread t2([&] { second = PostKey("lease-2"); });
  gate2.WaitArrived();  // the takeover runs, not yet stored
  gate1.Open();
  t1.join();
  ExpectProblem(first, 409, "lease-lost", "same-key");
  EXPECT_EQ(first.header("Retry-After"), "1");
  gate2.Open();
  t2.join();
  EXPECT_EQ(second.status, 201);
  EXPECT_FALSE(second.replayed());
  // The first's client retries with the same key: the stored response.
  Reply retry = PostKey("lease-2");
  EXPECT_TRUE(retry.replayed());
  ExpectSameResponse(second, retry);
  std::lock_guard provider_lock(provider.mu);
  EXPECT_EQ(provider.charges.size(), 1u);
}

TEST_F(IdempotencyTest, AnExpiredLeaseNotTakenOverStillCompletes) {
  Gate gate;
  OneChargePerKey provider;
  Route("/charges", {.lease_ms = 1'000}, LeaseHandler(executions_, gate, nullptr, provider));
  Start();
  Reply first;
  std::thread t([&] { first = PostKey("lease-3"); });
  gate.WaitArrived();
  env_.Advance(5'000);
  gate.Open();
  t.join();
  EXPECT_EQ(first.status, 201);
  EXPECT_FALSE(first.replayed());
  Reply again = PostKey("lease-3");
  EXPECT_TRUE(again.replayed());
  ExpectSameResponse(first, again);
  EXPECT_EQ(executions_.load(), 1);
}

TEST_F(IdempotencyTest, ACorruptStoredResponseIs500NotAReplay) {
  Route("/charges", {}, ChargeHandler());
  Start();
  // A record under the middleware's scope with the request's fingerprint,
  // completed with bytes that are not a stored response.
  auto c = claims_->Claim({.scope = "acct_a|POST /charges",
                           .key = "corrupt-1",
                           .fingerprint = http::RequestFingerprint("POST", "/charges", kBody)});
  ASSERT_OK(c);
  ASSERT_EQ(c->kind, ClaimOutcome::Kind::kStarted);
  ASSERT_TRUE(claims_->Complete(c->token, std::string("idem-http-1\0\0", 13)).ok());
  for (int i = 0; i < 2; ++i) {
    Reply r = PostKey("corrupt-1");
    ExpectProblem(r, 500, "stored-response-corrupt", "no");
    EXPECT_NE(r.json().value("detail", "").find("corruption"), std::string::npos) << r.body;
  }
  EXPECT_EQ(executions_.load(), 0);
}

TEST_F(IdempotencyTest, KeysAreScopedByPrincipal) {
  Route("/charges", {}, ChargeHandler());
  Start();
  Reply a = PostKey("shared-1", kBody, "sk_a");
  Reply b = PostKey("shared-1", kBody, "sk_b");
  EXPECT_EQ(a.status, 201);
  EXPECT_EQ(b.status, 201);
  EXPECT_FALSE(b.replayed());
  EXPECT_NE(a.body, b.body);
  // And B may use A's key for another body: it is B's own key.
  EXPECT_EQ(PostKey("shared-2", kBody, "sk_a").status, 201);
  Reply b3 = PostKey("shared-2", R"({"amount":1,"currency":"eur"})", "sk_b");
  EXPECT_EQ(b3.status, 201);
  EXPECT_TRUE(PostKey("shared-2", kBody, "sk_a").replayed());
  EXPECT_TRUE(PostKey("shared-2", R"({"amount":1,"currency":"eur"})", "sk_b").replayed());
  EXPECT_EQ(PostKey("shared-1", kBody, "sk_a").body, a.body);
  EXPECT_EQ(PostKey("shared-1", kBody, "sk_b").body, b.body);
  EXPECT_EQ(executions_.load(), 4);
}

}  // namespace
}  // namespace idem::testing
