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
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "http/http_test_util.h"
#include "idem/consumer.h"
#include "idem/http/client.h"
#include "idem/http/idempotency.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "idem/trace.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using namespace std::string_literals;

using http::Client;
using ClientOptions = http::Client::Options;

constexpr char kBody[] = R"({"amount":4000,"currency":"usd"})";

// What a server saw: one entry per request that reached it.
struct Seen {
  std::mutex mu;
  std::vector<std::string> keys;  // the raw Idempotency-Key header values
  int count() {
    std::lock_guard lock(mu);
    return static_cast<int>(keys.size());
  }
  // A copy, under the lock: the server's threads wrote them, and an answer
  // over a socket is no happens-before edge ThreadSanitizer can see.
  std::vector<std::string> Keys() {
    std::lock_guard lock(mu);
    return keys;
  }
  int Record(const ::httplib::Request& req) {
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

// A TCP server on 127.0.0.1 that reads each connection's first bytes (the
// request) and never answers: it keeps the connection open (kHang: the
// client's read times out) or closes it (kClose: the connection ends after
// the request was sent). One connection at a time.
class SilentServer {
 public:
  enum class Mode { kHang, kClose };
  explicit SilentServer(Mode mode) : mode_(mode) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_fd_, 16) != 0)
      return;
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Loop(); });
  }
  ~SilentServer() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    ::shutdown(listen_fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    for (int fd : fds_) ::close(fd);
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }
  int port() const { return port_; }
  // Connections that sent a request.
  int requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }
  void WaitRequests(int n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return requests_ >= n; });
  }

 private:
  void Loop() {
    for (;;) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) {
        if (errno == EINTR) continue;
        return;
      }
      {
        std::lock_guard lock(mu_);
        fds_.push_back(fd);
        if (stopping_) return;
      }
      char buf[8192];
      if (::recv(fd, buf, sizeof buf, 0) > 0) {
        std::lock_guard lock(mu_);
        ++requests_;
        cv_.notify_all();
      }
      if (mode_ == Mode::kClose) ::shutdown(fd, SHUT_RDWR);
    }
  }

  const Mode mode_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> fds_;  // guarded by mu_ while thread_ runs
  bool stopping_ = false;
  int requests_ = 0;
};

class ClientTest : public ::testing::Test {
 protected:
  std::unique_ptr<Client> NewClient(int port, int max_attempts = 6, int64_t read_timeout_ms = 120'000) {
    auto c = Client::Open({.base_url = "http://127.0.0.1:" + std::to_string(port),
                           .bearer = "sk_a",
                           .max_attempts = max_attempts,
                           .read_timeout_ms = read_timeout_ms,
                           .env = &env_});
    EXPECT_OK(c);
    return c.ok() ? std::move(*c) : nullptr;
  }

  // POST /charges records the request and answers `status` (with `body`).
  void Answer(int status, std::string body = "") {
    server_.server().Post("/charges", [this, status, body](const ::httplib::Request& req, ::httplib::Response& res) {
      seen_.Record(req);
      res.status = status;
      if (!body.empty()) res.set_content(body, "text/plain");
    });
  }

  // `r` failed with `code`, and its message holds every one of `parts`.
  static void ExpectError(const Result<http::Response>& r, Code code, const std::vector<std::string>& parts) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    for (const std::string& part : parts) EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status();
  }

  // The Idempotency middleware on SQLite in front of `handler` at /charges.
  void Guarded(::httplib::Server::Handler handler, http::RoutePolicy policy = {}) {
    auto s = sqlite::Store::Open({.path = dir_.File("idem.db"), .synchronous = sqlite::Synchronous::kNormal});
    ASSERT_OK(s);
    store_ = std::move(*s);
    claims_ = std::make_unique<Claims>(*store_->claim_store());
    idem_ = OpenMiddleware(*claims_, http::BearerKeys({{"sk_a", "acct_a"}}));
    auto wrapped = Must(idem::httplib::Wrap(*idem_, "/charges", std::move(policy), std::move(handler)));
    server_.server().Post("/charges", [this, wrapped](const ::httplib::Request& req, ::httplib::Response& res) {
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
  server_.server().Post("/charges", [&](const ::httplib::Request& req, ::httplib::Response& res) {
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
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->attempts, 3);
  EXPECT_FALSE(r->replayed);
  EXPECT_EQ(r->body, R"({"id":"ch_1"})");
  EXPECT_EQ(r->header("Location"), "/charges/ch_1");
  EXPECT_EQ(r->header("location"), "/charges/ch_1");  // header names are case-insensitive
  EXPECT_EQ(r->header("LOCATION"), "/charges/ch_1");
  EXPECT_EQ(r->header("Locatio"), "");
  EXPECT_EQ(seen_.Keys(), std::vector<std::string>(3, "\"order-42:charge\""));
  // Exponential backoff with up to 25% jitter: 50 ms, then 100 ms.
  auto sleeps = env_.sleeps();
  ASSERT_EQ(sleeps.size(), 2u);
  EXPECT_GE(sleeps[0], 50);
  EXPECT_LE(sleeps[0], 62);
  EXPECT_GE(sleeps[1], 100);
  EXPECT_LE(sleeps[1], 125);
  // Slept in slices of at most 50 ms (so a Cancel() is seen within one).
  auto slices = env_.slices();
  EXPECT_GE(slices.size(), 4u);
  for (int64_t slice : slices) EXPECT_LE(slice, 50);
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
  Guarded([](const ::httplib::Request&, ::httplib::Response& res) {
    res.status = 201;
    res.set_content(R"({"id":"ch_up"})", "application/json");
  });
  auto client = NewClient(port.port());
  auto r = client->Post("/charges", kBody, "conn-1");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->attempts, 2);
  EXPECT_FALSE(r->replayed);
  // The same key again (a caller's own retry): the stored response.
  auto again = client->Post("/charges", kBody, "conn-1");
  ASSERT_OK(again);
  EXPECT_EQ(again->status, 201);
  EXPECT_TRUE(again->replayed);
  EXPECT_EQ(again->attempts, 1);
  EXPECT_EQ(again->body, r->body);
  EXPECT_EQ(seen_.Keys(), std::vector<std::string>(2, "\"conn-1\""));
}

TEST_F(ClientTest, Retries409UntilTheFirstRequestIsDoneAndGetsItsReplay) {
  Gate gate;
  std::atomic<int> executions{0};
  Guarded([&](const ::httplib::Request&, ::httplib::Response& res) {
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
  ASSERT_OK(r);
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
  server_.server().Post("/charges", [&](const ::httplib::Request& req, ::httplib::Response& res) {
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
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(env_.sleeps(), std::vector<int64_t>{1'000});
  EXPECT_EQ(seen_.Keys(), std::vector<std::string>(2, "\"rate-1\""));
}

TEST_F(ClientTest, Never422ItIsABugInTheCaller) {
  std::atomic<int> executions{0};
  Guarded([&](const ::httplib::Request&, ::httplib::Response& res) {
    ++executions;
    res.status = 201;
  });
  server_.Start();
  auto client = NewClient(server_.port());
  auto r1 = client->Post("/charges", kBody, "reused-1");
  ASSERT_OK(r1);
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
  server_.server().Post("/charges", [&](const ::httplib::Request& req, ::httplib::Response& res) {
    const int n = seen_.Record(req);
    res.status = n < 3 ? 502 : 503;
    res.set_content("still down #" + std::to_string(n), "text/plain");
  });
  server_.Start();
  auto client = NewClient(server_.port(), /*max_attempts=*/3);
  auto r = client->Post("/charges", kBody, "down-1");
  ASSERT_FALSE(r.ok());
  // A 5xx may come after the work was done: in doubt, not unavailable.
  EXPECT_EQ(r.status().code(), Code::kInDoubt) << r.status();
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("3 attempts"), std::string::npos) << m;
  EXPECT_NE(m.find("\"down-1\""), std::string::npos) << m;
  EXPECT_NE(m.find("HTTP 503"), std::string::npos) << m;
  EXPECT_NE(m.find("still down #3"), std::string::npos) << m;
  EXPECT_EQ(seen_.Keys(), std::vector<std::string>(3, "\"down-1\""));
  EXPECT_EQ(env_.sleeps().size(), 2u);  // none after the last attempt

  // A connection error is named as such; no attempt reached the server:
  // unavailable.
  RefusingPort refused;
  auto nobody = NewClient(refused.port(), /*max_attempts=*/2);
  auto r2 = nobody->Post("/charges", kBody, "down-2");
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.status().code(), Code::kUnavailable) << r2.status();
  EXPECT_NE(r2.status().message().find("2 attempts"), std::string::npos) << r2.status();
  EXPECT_NE(r2.status().message().find("connection error"), std::string::npos) << r2.status();
  EXPECT_NE(r2.status().message().find("\"down-2\""), std::string::npos) << r2.status();
}

TEST_F(ClientTest, KeysWithQuotesAndBackslashesArriveIntact) {
  std::mutex mu;
  std::vector<std::string> keys;  // what the middleware parsed
  Guarded([&](const ::httplib::Request&, ::httplib::Response& res) {
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
    ASSERT_OK(r);
    EXPECT_EQ(r->status, 201);
    EXPECT_EQ(r->replayed, i == 1);
  }
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(keys, std::vector<std::string>{key});
  }
  EXPECT_EQ(seen_.Keys(), std::vector<std::string>(2, R"("order \"42\" \\ charge\\")"));
  EXPECT_EQ(http::QuoteKey(key), R"("order \"42\" \\ charge\\")");
}

TEST_F(ClientTest, OtherStatusesAreReturnedAsTheyAre) {
  server_.server().Post("/charges", [&](const ::httplib::Request& req, ::httplib::Response& res) {
    seen_.Record(req);
    res.status = 400;
    res.set_header("Idempotent-Replayed", "true");
    res.set_content(R"({"error":"bad amount"})", "application/json");
  });
  server_.Start();
  auto client = NewClient(server_.port());
  for (int i = 0; i < 2; ++i) {
    auto r = client->Post("/charges", kBody, "plain-1");
    ASSERT_OK(r);
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
  server_.server().Get("/health", [&](const ::httplib::Request&, ::httplib::Response& res) {
    if (++health == 1) {
      res.status = 500;
      return;
    }
    res.set_content("healthy", "text/plain");
  });
  server_.server().Get("/busy", [&](const ::httplib::Request&, ::httplib::Response& res) { res.status = 409; });
  server_.Start();
  auto client = NewClient(server_.port());
  auto r = client->Get("/health");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(r->body, "healthy");
  auto busy = client->Get("/busy");
  ASSERT_OK(busy);
  EXPECT_EQ(busy->status, 409);
  EXPECT_EQ(busy->attempts, 1);
}

// Negative backoffs would sleep for ever (the jitter of a negative delay
// wraps to a huge one): refused at Create.
TEST(ClientCreate, RejectsNegativeBackoffs) {
  for (auto [base, max] : {std::pair<int64_t, int64_t>{-1, 2000}, {50, -1}}) {
    auto c = Client::Open({.base_url = "http://127.0.0.1:8080", .backoff_base_ms = base, .backoff_max_ms = max});
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
    EXPECT_NE(c.status().message().find("backoff"), std::string::npos) << c.status();
  }
}

// A key the header cannot carry is refused before anything is sent: a CR
// or LF would start a header of its own (header injection).
TEST_F(ClientTest, AKeyTheHeaderCannotCarryIsRefusedNotSent) {
  server_.server().Post("/charges", [&](const ::httplib::Request& req, ::httplib::Response& res) {
    seen_.Record(req);
    res.status = 201;
  });
  server_.Start();
  auto client = NewClient(server_.port());
  for (const std::string& key :
       {std::string("k\r\nX-Injected: yes"), std::string("caf\xc3\xa9"), std::string(1, '\0'), std::string("tab\there"),
        std::string("del\x7f"), std::string("\x1f"), std::string(256, 'k'), std::string()}) {
    for (int i = 0; i < 2; ++i) {
      auto r = client->Post("/charges", kBody, key);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status();
      // It says how to make a key that works.
      EXPECT_NE(r.status().message().find("idem::DownstreamKey"), std::string::npos) << r.status();
    }
  }
  EXPECT_TRUE(seen_.Keys().empty());  // nothing reached the server
  auto fine = client->Post("/charges", kBody, std::string(255, 'k'));
  ASSERT_OK(fine);
  EXPECT_EQ(fine->status, 201);
}

TEST(ClientCreate, RejectsBadOptions) {
  const char* bad[] = {"",
                       "127.0.0.1:8080",
                       "ftp://127.0.0.1:8080",
                       "http://127.0.0.1:8080/v1?x=1",
                       "http://127.0.0.1:8080/v1#top",
                       "http://127.0.0.1:8080/a b",
                       "http://user:pw@127.0.0.1:8080",
                       "https://127.0.0.1:0",
                       "https://",
                       "http://127.0.0.1:0",
                       "http://127.0.0.1:65536",
                       "http://127.0.0.1:",
                       "http://127.0.0.1:80x",
                       "http://:8080",
                       "http://"};
  for (const char* url : bad) {
    auto c = Client::Open({.base_url = url});
    EXPECT_FALSE(c.ok()) << url;
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << url;
    }
  }
  auto zero = Client::Open({.base_url = "http://127.0.0.1:8080", .max_attempts = 0});
  EXPECT_FALSE(zero.ok());
  for (const char* url :
       {"http://127.0.0.1:8080", "http://127.0.0.1:8080/", "http://localhost", "http://127.0.0.1:8080/api/v1",
        "http://127.0.0.1:8080/api/v1/", "https://127.0.0.1:8443", "https://localhost/v1"}) {
    auto c = Client::Open({.base_url = url});
    EXPECT_TRUE(c.ok()) << url << ": " << c.status();
  }
  auto c = Client::Open({.base_url = "http://127.0.0.1:1"});
  ASSERT_TRUE(c.ok());
  auto r = (*c)->Post("/charges", kBody, "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// What a caller learns when the tries run out: in progress, in doubt, busy,
// unavailable. Each message names the key and the last error.

TEST_F(ClientTest, Last409IsInProgressNotFailed) {
  Answer(409, "still running");
  server_.Start();
  auto client = NewClient(server_.port(), /*max_attempts=*/3);
  ExpectError(client->Post("/charges", kBody, "running-1"), Code::kInProgress,
              {"\"running-1\"", "HTTP 409: still running"});
  EXPECT_EQ(seen_.count(), 3);
}

TEST_F(ClientTest, ALostResponseIsInDoubt) {
  for (auto mode : {SilentServer::Mode::kClose, SilentServer::Mode::kHang}) {
    SCOPED_TRACE(mode == SilentServer::Mode::kClose ? "closed after the request" : "read timeout");
    SilentServer silent(mode);
    ASSERT_GT(silent.port(), 0);
    auto client = NewClient(silent.port(), /*max_attempts=*/2, /*read_timeout_ms=*/200);
    ExpectError(client->Post("/charges", kBody, "lost-1"), Code::kInDoubt, {"\"lost-1\"", "no answer", "same key"});
    EXPECT_EQ(silent.requests(), 2);
  }
}

// One attempt that may have been applied makes the whole call in doubt,
// even when the later attempts could not connect at all.
TEST_F(ClientTest, InDoubtOnceThenRefusedIsStillInDoubt) {
  Answer(500);
  server_.Start();
  env_.OnSleep([&](int n) {
    if (n == 1) server_.Stop();
  });
  auto client = NewClient(server_.port(), /*max_attempts=*/3);
  ExpectError(client->Post("/charges", kBody, "half-1"), Code::kInDoubt, {"\"half-1\"", "connection error"});
  EXPECT_EQ(seen_.count(), 1);
}

TEST_F(ClientTest, Only429IsBusyNotApplied) {
  Answer(429);
  server_.Start();
  auto client = NewClient(server_.port(), /*max_attempts=*/2);
  ExpectError(client->Post("/charges", kBody, "slow-down-1"), Code::kBusy, {"\"slow-down-1\"", "429", "not applied"});
  EXPECT_EQ(seen_.count(), 2);
}

// ---------------------------------------------------------------------------
// Keys: every byte an sf-string can carry goes, escaped, and arrives intact.

TEST_F(ClientTest, EveryPrintableAsciiKeyArrivesIntact) {
  std::mutex mu;
  std::vector<std::string> keys;
  Guarded([&](const ::httplib::Request&, ::httplib::Response& res) {
    std::lock_guard lock(mu);
    keys.push_back(http::CurrentClaim()->key);
    res.status = 201;
  });
  server_.Start();
  auto client = NewClient(server_.port());
  std::string all;
  for (int c = 0x20; c <= 0x7e; ++c) all += static_cast<char>(c);
  const std::vector<std::string> sent = {all, " ", "  leading and trailing  ", "\"", "\\", "a b\\\"c\\\\"};
  for (const std::string& key : sent) {
    auto r = client->Post("/charges", kBody, key);
    ASSERT_OK(r);
    EXPECT_EQ(r->status, 201);
  }
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(keys, sent);
  }
  // The header is the sf-string: quoted, \" and \\ escaped.
  std::lock_guard lock(seen_.mu);
  ASSERT_EQ(seen_.keys.size(), sent.size());
  EXPECT_EQ(seen_.keys[1], "\" \"");
  EXPECT_EQ(seen_.keys[5], R"("a b\\\"c\\\\")");
}

// ---------------------------------------------------------------------------
// Base path and extra headers.

TEST_F(ClientTest, BasePathAndHeadersGoOnEveryRequest) {
  std::mutex mu;
  std::vector<std::string> paths;
  std::vector<::httplib::Headers> headers;
  auto record = [&](const ::httplib::Request& req, ::httplib::Response& res) {
    std::lock_guard lock(mu);
    paths.push_back(req.path);
    headers.push_back(req.headers);
    res.status = 200;
  };
  server_.server().Post(R"(/api/v1/.*)", record);
  server_.server().Get(R"(/api/v1/.*)", record);
  server_.Start();
  auto c = Client::Open({.base_url = "http://127.0.0.1:" + std::to_string(server_.port()) + "/api/v1/",
                         .bearer = "sk_a",
                         .headers = {{"X-Tenant", "acme"}, {"Stripe-Version", "2024-06-20"}},
                         .env = &env_});
  ASSERT_OK(c);
  auto client = std::move(*c);
  ASSERT_TRUE(client->Post("/charges", kBody, "p-1").ok());
  ASSERT_TRUE(client->Post("refunds", kBody, "p-2", {{"X-Request-Id", "req 7"}}).ok());
  ASSERT_TRUE(client->Get("/charges/ch_1").ok());
  std::lock_guard lock(mu);
  EXPECT_EQ(paths, (std::vector<std::string>{"/api/v1/charges", "/api/v1/refunds", "/api/v1/charges/ch_1"}));
  ASSERT_EQ(headers.size(), 3u);
  for (const auto& h : headers) {
    EXPECT_EQ(h.find("X-Tenant")->second, "acme");
    EXPECT_EQ(h.find("Stripe-Version")->second, "2024-06-20");
    EXPECT_EQ(h.find("Authorization")->second, "Bearer sk_a");
  }
  EXPECT_EQ(headers[0].count("X-Request-Id"), 0u);
  EXPECT_EQ(headers[1].find("X-Request-Id")->second, "req 7");
  EXPECT_EQ(headers[1].find("Idempotency-Key")->second, "\"p-2\"");
}

// The calling thread's trace (the message a handler works on: idem/trace.h)
// goes on every request that names none of its own, retries included.
TEST_F(ClientTest, TheCurrentTraceGoesOnEveryRequestAndEveryRetry) {
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> got;  // traceparent, tracestate per request
  int posts = 0;
  auto record = [&](const ::httplib::Request& req, ::httplib::Response& res) {
    std::lock_guard lock(mu);
    got.emplace_back(req.get_header_value("traceparent"), req.get_header_value("tracestate"));
    res.status = req.method == "POST" && ++posts == 1 ? 503 : 200;  // the first POST is retried
  };
  server_.server().Post("/charges", record);
  server_.server().Get("/charges/ch_1", record);
  server_.Start();
  auto client = NewClient(server_.port());
  const std::string trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  {
    TraceScope scope({.traceparent = trace, .tracestate = "congo=t61rcWkgMzE"});
    ASSERT_TRUE(client->Post("/charges", kBody, "order-1:charge").ok());
    ASSERT_TRUE(client->Get("/charges/ch_1").ok());
    // A request that names its own trace keeps it.
    ASSERT_TRUE(client
                    ->Post("/charges", kBody, "order-2:charge",
                           {{"TraceParent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}})
                    .ok());
  }
  ASSERT_TRUE(client->Post("/charges", kBody, "order-3:charge").ok());  // no trace here
  std::lock_guard lock(mu);
  const std::pair<std::string, std::string> traced{trace, "congo=t61rcWkgMzE"};
  EXPECT_EQ(got,
            (std::vector<std::pair<std::string, std::string>>{
                traced, traced, traced, {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", ""}, {"", ""}}));
}

TEST_F(ClientTest, AHeaderThatCannotBeSentIsRefusedNamingIt) {
  const std::vector<std::pair<std::string, std::string>> bad = {{"X-Evil", "a\r\nX-Injected: yes"},
                                                                {"X-Evil", "line\nfeed"},
                                                                {"X-Evil", "nul\0"s},
                                                                {"X-Evil", "caf\xc3\xa9"},
                                                                {"X Evil", "v"},
                                                                {"X-Evil:", "v"},
                                                                {"X-Evil\r\n", "v"},
                                                                {"", "v"},
                                                                {"Idempotency-Key", "k"},
                                                                {"content-length", "1"},
                                                                {"Host", "elsewhere"},
                                                                {"Authorization", "Bearer other"}};
  for (const auto& [name, value] : bad) {
    SCOPED_TRACE(name + ": " + value);
    auto c = Client::Open({.base_url = "http://127.0.0.1:8080", .bearer = "sk_a", .headers = {{name, value}}});
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << c.status();
    if (!name.empty()) {
      EXPECT_NE(c.status().message().find("header '" + name.substr(0, 6)), std::string::npos) << c.status();
    }
  }
  // Per request: refused the same way, and nothing is sent.
  Answer(201);
  server_.Start();
  auto client = NewClient(server_.port());
  for (const auto& [name, value] : bad)
    ExpectError(client->Post("/charges", kBody, "h-1", {{name, value}}), Code::kInvalidArgument, {});
  for (const char* path : {"/charges\r\nX-Injected: yes", "/char ges", "/caf\xc3\xa9"})
    ExpectError(client->Post(path, kBody, "h-1"), Code::kInvalidArgument, {"the path"});
  ExpectError(client->Post("/charges", kBody, "h-1", {}, "text/plain\r\nX-Injected: yes"), Code::kInvalidArgument,
              {"Content-Type"});
  EXPECT_EQ(seen_.count(), 0);
  // An Authorization header of one's own is fine without `bearer`.
  EXPECT_TRUE(Client::Open({.base_url = "http://127.0.0.1:8080", .headers = {{"Authorization", "Basic YTpi"}}}).ok());
  EXPECT_FALSE(Client::Open({.base_url = "http://127.0.0.1:8080", .bearer = "sk\r\nX: y"}).ok());
}

// ---------------------------------------------------------------------------
// One Client, many threads.

TEST_F(ClientTest, OneClientServesManyThreadsAtOnce) {
  constexpr int kThreads = 8, kPerThread = 50;
  std::mutex mu;
  std::condition_variable cv;
  int waiting = 0;
  server_.server().Post("/charges", [&](const ::httplib::Request& req, ::httplib::Response& res) {
    // The first kThreads requests are one per thread (each thread waits for
    // its answer before it sends again): they wait until all are here, which
    // only requests in flight at once can do.
    if (seen_.Record(req) <= kThreads) {
      std::unique_lock lock(mu);
      ++waiting;
      cv.notify_all();
      if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return waiting >= kThreads; })) {
        res.status = 400;
        res.set_content("the requests were not in flight at once", "text/plain");
        return;
      }
    }
    res.status = 201;
    res.set_content(req.get_header_value("Idempotency-Key"), "text/plain");
  });
  server_.Start();
  auto client = NewClient(server_.port());
  std::vector<std::vector<std::string>> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Appended, not "t" + std::to_string(t): g++ 12 warns on that (-Wrestrict).
        std::string key = std::to_string(t);
        key.insert(0, 1, 't').append(1, '-').append(std::to_string(i));
        auto r = client->Post("/charges", kBody, key);
        if (!r.ok())
          errors[t].push_back(key + ": " + r.status().ToString());
        else if (r->status != 201 || r->body != http::QuoteKey(key))  // each answer to its own request
          errors[t].push_back(key + ": " + std::to_string(r->status) + " " + r->body);
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_TRUE(e.empty()) << e.front();
  std::lock_guard lock(seen_.mu);
  const std::set<std::string> distinct(seen_.keys.begin(), seen_.keys.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kThreads * kPerThread));
}

// ---------------------------------------------------------------------------
// Cancellation: Cancel() and a stopping Consumer.

TEST_F(ClientTest, CancelEndsAHungRequestAfterItsAttemptNotTheSchedule) {
  SilentServer hung(SilentServer::Mode::kHang);
  ASSERT_GT(hung.port(), 0);
  auto client = NewClient(hung.port(), /*max_attempts=*/6, /*read_timeout_ms=*/300);
  Result<http::Response> r = Status::Internal("not run");
  std::thread t([&] { r = client->Post("/charges", kBody, "hung-1"); });
  hung.WaitRequests(1);
  client->Cancel();
  t.join();
  // Named: the key, the cause, that it may have been applied, the last error.
  ExpectError(r, Code::kAborted, {"\"hung-1\"", "Client::Cancel", "may have reached the server", "no answer"});
  EXPECT_EQ(hung.requests(), 1);  // not the 6 of the schedule
  EXPECT_TRUE(env_.slices().empty());
  // Cancelled for good: the next call sends nothing.
  ExpectError(client->Post("/charges", kBody, "hung-2"), Code::kAborted, {"\"hung-2\"", "after 0 attempts"});
  EXPECT_EQ(hung.requests(), 1);
}

TEST_F(ClientTest, CancelIsSeenBetweenTheSlicesOfABackoff) {
  Answer(503);
  server_.Start();
  auto c = Client::Open({.base_url = server_.url(), .max_attempts = 6, .backoff_base_ms = 1'000, .env = &env_});
  ASSERT_OK(c);
  auto client = std::move(*c);
  env_.OnSlice([&](int n) {
    if (n == 3) client->Cancel();
  });
  ExpectError(client->Post("/charges", kBody, "backoff-1"), Code::kAborted, {"\"backoff-1\"", "HTTP 503"});
  EXPECT_EQ(seen_.count(), 1);
  EXPECT_EQ(env_.slices(), (std::vector<int64_t>{50, 50, 50}));  // of a backoff of 1,000-1,250 ms
}

// One message, delivered once; Receive waits a little when there is none.
class OneMessageSource final : public Source {
 public:
  Result<std::vector<Delivery>> Receive(int, int64_t) override {
    if (!given_.exchange(true))
      return std::vector<Delivery>{{.message = {.id = "m-1", .payload = "{}"}, .receipt = "r"}};
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return std::vector<Delivery>{};
  }
  Status Ack(const Delivery&) override { return Status::OK(); }
  Status Nack(const Delivery&, int64_t) override { return Status::OK(); }
  std::string_view Kind() const override { return "one-message"; }

 private:
  std::atomic<bool> given_{false};
};

TEST_F(ClientTest, AStoppingConsumersHandlerStopsRetrying) {
  SilentServer hung(SilentServer::Mode::kHang);
  ASSERT_GT(hung.port(), 0);
  auto client = NewClient(hung.port(), /*max_attempts=*/6, /*read_timeout_ms=*/300);
  auto store = sqlite::Store::Open({.path = dir_.File("inbox.db"), .synchronous = sqlite::Synchronous::kNormal});
  ASSERT_OK(store);
  auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  OneMessageSource source;
  std::mutex mu;
  std::vector<Status> seen;
  Consumer consumer(source, inbox, [&](Transaction&, const Message& m) {
    EXPECT_FALSE(StopRequested());
    auto r = client->Post("/charges", kBody, DownstreamKey(m, "charge"));
    std::lock_guard lock(mu);
    seen.push_back(r.status());
    return r.status();
  });
  Status run;
  std::thread t([&] { run = consumer.Run(); });
  hung.WaitRequests(1);
  consumer.Stop();
  t.join();
  EXPECT_TRUE(run.ok()) << run;
  std::lock_guard lock(mu);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].code(), Code::kAborted) << seen[0];
  EXPECT_NE(seen[0].message().find("Consumer is stopping"), std::string::npos) << seen[0];
  EXPECT_NE(seen[0].message().find("\"m-1:charge\""), std::string::npos) << seen[0];
  EXPECT_EQ(hung.requests(), 1);  // not the 6 of the schedule
}

}  // namespace
}  // namespace idem::testing
