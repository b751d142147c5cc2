// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::http::Client against real servers on loopback: what it retries
// (connection errors, 5xx, 409, 429), what it never retries (422), how many
// times, with which key, and what it reports. The client's clock is a
// HookedEnv: its backoff sleeps only record the time asked for and run the
// test's hook between two attempts.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/http_test_util.h"
#include "idem/http/client.h"
#include "idem/http/idempotency.h"
#include "idem/sqlite/store.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using http::Client;
using http::ClientOptions;

constexpr char kBody[] = R"({"amount":4000,"currency":"usd"})";

// What a server saw: one entry per request that reached it.
struct Seen {
  std::mutex mu;
  std::vector<std::string> keys;  // the raw Idempotency-Key header values
  int count() {
    std::lock_guard lock(mu);
    return static_cast<int>(keys.size());
  }
  int Record(const httplib::Request& req) {
    std::lock_guard lock(mu);
    keys.push_back(req.has_header("Idempotency-Key") ? req.get_header_value("Idempotency-Key") : "<none>");
    return static_cast<int>(keys.size());
  }
};

// A TCP port on 127.0.0.1 that is bound but not listening: connecting is
// refused at once. Release() frees it for a server to bind.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~RefusingPort() { Release(); }
  int port() const { return port_; }
  void Release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class ClientTest : public ::testing::Test {
 protected:
  std::unique_ptr<Client> NewClient(int port, int max_attempts = 6) {
    auto c = Client::Create({.base_url = "http://127.0.0.1:" + std::to_string(port),
                             .bearer = "sk_a",
                             .max_attempts = max_attempts,
                             .read_timeout_ms = 120'000,
                             .env = &env_});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // The Idempotency middleware on SQLite in front of `handler` at /charges.
  void Guarded(httplib::Server::Handler handler, http::RoutePolicy policy = {}) {
    auto s = sqlite::Open({.path = dir_.File("idem.db"), .synchronous = sqlite::Synchronous::kNormal});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    claims_ = std::make_unique<Claims>(*store_->claim_store());
    idem_ = std::make_unique<http::Idempotency>(*claims_, http::BearerKeys({{"sk_a", "acct_a"}}));
    auto wrapped = idem_->Wrap("/charges", std::move(policy), std::move(handler));
    server_.server().Post("/charges", [this, wrapped](const httplib::Request& req, httplib::Response& res) {
      seen_.Record(req);
      wrapped(req, res);
    });
  }

  TempDir dir_;
  HookedEnv env_;
  Seen seen_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Claims> claims_;
  std::unique_ptr<http::Idempotency> idem_;
  LoopbackServer server_;
};

TEST_F(ClientTest, Retries5xxWithTheSameKeyUntil201) {
  server_.server().Post("/charges", [&](const httplib::Request& req, httplib::Response& res) {
    if (seen_.Record(req) <= 2) {
      res.status = 503;
      res.set_content("warming up", "text/plain");
      return;
    }
    res.status = 201;
    res.set_header("Location", "/charges/ch_1");
    res.set_content(R"({"id":"ch_1"})", "application/json");
  });
  server_.Start();
  auto client = NewClient(server_.port());
  auto r = client->Post("/charges", kBody, "order-42:charge");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->attempts, 3);
  EXPECT_FALSE(r->replayed);
  EXPECT_EQ(r->body, R"({"id":"ch_1"})");
  EXPECT_EQ(r->header("Location"), "/charges/ch_1");
  EXPECT_EQ(r->header("location"), "/charges/ch_1");  // header names are case-insensitive
  EXPECT_EQ(r->header("LOCATION"), "/charges/ch_1");
  EXPECT_EQ(r->header("Locatio"), "");
  EXPECT_EQ(seen_.keys, std::vector<std::string>(3, "\"order-42:charge\""));
  // Exponential backoff with up to 25% jitter: 50 ms, then 100 ms.
  auto sleeps = env_.sleeps();
  ASSERT_EQ(sleeps.size(), 2u);
  EXPECT_GE(sleeps[0], 50);
  EXPECT_LE(sleeps[0], 62);
  EXPECT_GE(sleeps[1], 100);
  EXPECT_LE(sleeps[1], 125);
}

TEST_F(ClientTest, RetriesAConnectionErrorUntilTheServerIsUp) {
  RefusingPort port;
  ASSERT_GT(port.port(), 0);
  // The server comes up between the first (refused) attempt and the second.
  env_.OnSleep([&](int n) {
    if (n != 1) return;
    port.Release();
    server_.StartOn(port.port());
  });
  Guarded([](const httplib::Request&, httplib::Response& res) {
    res.status = 201;
    res.set_content(R"({"id":"ch_up"})", "application/json");
  });
  auto client = NewClient(port.port());
  auto r = client->Post("/charges", kBody, "conn-1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->attempts, 2);
  EXPECT_FALSE(r->replayed);
  // The same key again (a caller's own retry): the stored response.
  auto again = client->Post("/charges", kBody, "conn-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->status, 201);
  EXPECT_TRUE(again->replayed);
  EXPECT_EQ(again->attempts, 1);
  EXPECT_EQ(again->body, r->body);
  EXPECT_EQ(seen_.keys, std::vector<std::string>(2, "\"conn-1\""));
}

TEST_F(ClientTest, Retries409UntilTheFirstRequestIsDoneAndGetsItsReplay) {
  Gate gate;
  std::atomic<int> executions{0};
  Guarded([&](const httplib::Request&, httplib::Response& res) {
    if (++executions == 1) gate.Arrive();
    res.status = 201;
    res.set_header("Location", "/charges/ch_first");
    res.set_content(R"({"id":"ch_first"})", "application/json");
  });
  server_.Start();
  // Another copy of the request (a retry from elsewhere) is running.
  Reply first;
  std::thread t([&] { first = Send(server_.port(), "POST", "/charges", Headers("sk_a", "\"busy-1\""), kBody); });
  gate.WaitArrived();
  env_.OnSleep([&](int n) {
    if (n != 1) return;
    gate.Open();
    t.join();
  });
  auto client = NewClient(server_.port());
  auto r = client->Post("/charges", kBody, "busy-1");
  if (t.joinable()) {
    gate.Open();
    t.join();
  }
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 201);
  EXPECT_TRUE(r->replayed);
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(r->body, first.body);
  EXPECT_EQ(r->header("Location"), "/charges/ch_first");
  EXPECT_EQ(executions.load(), 1);
  // Retry-After (30 s: the lease) is honoured up to backoff_max_ms (2 s).
  EXPECT_EQ(env_.sleeps(), std::vector<int64_t>{2'000});
}

TEST_F(ClientTest, Retries429HonouringRetryAfter) {
  server_.server().Post("/charges", [&](const httplib::Request& req, httplib::Response& res) {
    if (seen_.Record(req) == 1) {
      res.status = 429;
      res.set_header("Retry-After", "1");
      return;
    }
    res.status = 201;
  });
  server_.Start();
  auto client = NewClient(server_.port());
  auto r = client->Post("/charges", kBody, "rate-1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(env_.sleeps(), std::vector<int64_t>{1'000});
  EXPECT_EQ(seen_.keys, std::vector<std::string>(2, "\"rate-1\""));
}

TEST_F(ClientTest, Never422ItIsABugInTheCaller) {
  std::atomic<int> executions{0};
  Guarded([&](const httplib::Request&, httplib::Response& res) {
    ++executions;
    res.status = 201;
  });
  server_.Start();
  auto client = NewClient(server_.port());
  auto r1 = client->Post("/charges", kBody, "reused-1");
  ASSERT_TRUE(r1.ok()) << r1.status();
  for (int i = 0; i < 2; ++i) {
    auto r2 = client->Post("/charges", R"({"amount":9999,"currency":"usd"})", "reused-1");
    ASSERT_FALSE(r2.ok());
    EXPECT_EQ(r2.status().code(), Code::kConflict) << r2.status();
    EXPECT_NE(r2.status().message().find("bug"), std::string::npos) << r2.status();
    EXPECT_NE(r2.status().message().find("422"), std::string::npos) << r2.status();
  }
  EXPECT_EQ(seen_.count(), 3);  // one request each: never retried
  EXPECT_TRUE(env_.sleeps().empty());
  EXPECT_EQ(executions.load(), 1);
}

TEST_F(ClientTest, GivesUpAfterMaxAttemptsNamingTheLastError) {
  server_.server().Post("/charges", [&](const httplib::Request& req, httplib::Response& res) {
    const int n = seen_.Record(req);
    res.status = n < 3 ? 502 : 503;
    res.set_content("still down #" + std::to_string(n), "text/plain");
  });
  server_.Start();
  auto client = NewClient(server_.port(), /*max_attempts=*/3);
  auto r = client->Post("/charges", kBody, "down-1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status();
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("3 attempts"), std::string::npos) << m;
  EXPECT_NE(m.find("HTTP 503"), std::string::npos) << m;
  EXPECT_NE(m.find("still down #3"), std::string::npos) << m;
  EXPECT_EQ(seen_.keys, std::vector<std::string>(3, "\"down-1\""));
  EXPECT_EQ(env_.sleeps().size(), 2u);  // none after the last attempt

  // A connection error is named as such.
  RefusingPort refused;
  auto nobody = NewClient(refused.port(), /*max_attempts=*/2);
  auto r2 = nobody->Post("/charges", kBody, "down-2");
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.status().code(), Code::kUnavailable) << r2.status();
  EXPECT_NE(r2.status().message().find("2 attempts"), std::string::npos) << r2.status();
  EXPECT_NE(r2.status().message().find("connection error"), std::string::npos) << r2.status();
}

TEST_F(ClientTest, KeysWithQuotesAndBackslashesArriveIntact) {
  std::mutex mu;
  std::vector<std::string> keys;  // what the middleware parsed
  Guarded([&](const httplib::Request&, httplib::Response& res) {
    {
      std::lock_guard lock(mu);
      keys.push_back(http::CurrentClaim()->key);
    }
    res.status = 201;
    res.set_content(R"({"ok":true})", "application/json");
  });
  server_.Start();
  auto client = NewClient(server_.port());
  const std::string key = R"(order "42" \ charge\)";
  for (int i = 0; i < 2; ++i) {
    auto r = client->Post("/charges", kBody, key);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 201);
    EXPECT_EQ(r->replayed, i == 1);
  }
  EXPECT_EQ(keys, std::vector<std::string>{key});
  EXPECT_EQ(seen_.keys, std::vector<std::string>(2, R"("order \"42\" \\ charge\\")"));
  EXPECT_EQ(http::QuoteKey(key), R"("order \"42\" \\ charge\\")");
}

TEST_F(ClientTest, OtherStatusesAreReturnedAsTheyAre) {
  server_.server().Post("/charges", [&](const httplib::Request& req, httplib::Response& res) {
    seen_.Record(req);
    res.status = 400;
    res.set_header("Idempotent-Replayed", "true");
    res.set_content(R"({"error":"bad amount"})", "application/json");
  });
  server_.Start();
  auto client = NewClient(server_.port());
  for (int i = 0; i < 2; ++i) {
    auto r = client->Post("/charges", kBody, "plain-1");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(r->attempts, 1);
    EXPECT_TRUE(r->replayed);
    EXPECT_EQ(r->body, R"({"error":"bad amount"})");
    EXPECT_EQ(r->header("Content-Type"), "application/json");
  }
  EXPECT_EQ(seen_.count(), 2);
}

TEST_F(ClientTest, GetRetries5xxButNot409) {
  std::atomic<int> health{0};
  server_.server().Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    if (++health == 1) {
      res.status = 500;
      return;
    }
    res.set_content("healthy", "text/plain");
  });
  server_.server().Get("/busy", [&](const httplib::Request&, httplib::Response& res) { res.status = 409; });
  server_.Start();
  auto client = NewClient(server_.port());
  auto r = client->Get("/health");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(r->body, "healthy");
  auto busy = client->Get("/busy");
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_EQ(busy->status, 409);
  EXPECT_EQ(busy->attempts, 1);
}

// Negative backoffs would sleep for ever (the jitter of a negative delay
// wraps to a huge one): refused at Create.
TEST(ClientCreate, RejectsNegativeBackoffs) {
  for (auto [base, max] : {std::pair<int64_t, int64_t>{-1, 2000}, {50, -1}}) {
    auto c = Client::Create({.base_url = "http://127.0.0.1:8080", .backoff_base_ms = base, .backoff_max_ms = max});
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
    EXPECT_NE(c.status().message().find("backoff"), std::string::npos) << c.status();
  }
}

// A key the header cannot carry is refused before anything is sent: a CR
// or LF would start a header of its own (header injection).
TEST_F(ClientTest, AKeyTheHeaderCannotCarryIsRefusedNotSent) {
  server_.server().Post("/charges", [&](const httplib::Request& req, httplib::Response& res) {
    seen_.Record(req);
    res.status = 201;
  });
  server_.Start();
  auto client = NewClient(server_.port());
  for (const std::string key :
       {std::string("k\r\nX-Injected: yes"), std::string("caf\xc3\xa9"), std::string(1, '\0'), std::string(256, 'k')}) {
    for (int i = 0; i < 2; ++i) {
      auto r = client->Post("/charges", kBody, key);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status();
    }
  }
  EXPECT_TRUE(seen_.keys.empty());  // nothing reached the server
  auto fine = client->Post("/charges", kBody, std::string(255, 'k'));
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->status, 201);
}

TEST(ClientCreate, RejectsBadOptions) {
  const char* bad[] = {"",
                       "127.0.0.1:8080",
                       "https://127.0.0.1:8080",
                       "http://127.0.0.1:8080/v1",
                       "http://127.0.0.1:0",
                       "http://127.0.0.1:65536",
                       "http://127.0.0.1:",
                       "http://127.0.0.1:80x",
                       "http://:8080",
                       "http://"};
  for (const char* url : bad) {
    auto c = Client::Create({.base_url = url});
    EXPECT_FALSE(c.ok()) << url;
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << url;
    }
  }
  auto zero = Client::Create({.base_url = "http://127.0.0.1:8080", .max_attempts = 0});
  EXPECT_FALSE(zero.ok());
  for (const char* url : {"http://127.0.0.1:8080", "http://127.0.0.1:8080/", "http://localhost"}) {
    auto c = Client::Create({.base_url = url});
    EXPECT_TRUE(c.ok()) << url << ": " << c.status();
  }
  auto c = Client::Create({.base_url = "http://127.0.0.1:1"});
  ASSERT_TRUE(c.ok());
  auto r = (*c)->Post("/charges", kBody, "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace idem::testing
