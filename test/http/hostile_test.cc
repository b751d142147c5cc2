// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Hostile clients against idem::httplib::Server with POST /charges behind the
// Idempotency-Key middleware on SQLite (a transactional route: the charge row
// and the key's record in one commit; grouped commits on fibers): a slowloris
// (connections that send a header line, or a body byte, every half second and
// never finish), a connection flood (connections that send nothing, and
// connects closed at once), a request past its deadline, and the bounds on
// open connections. The attackers connect from 127.0.0.2 and 127.0.0.3 (all
// of 127/8 is loopback), the legitimate client from 127.0.0.1, so the
// per-address bound tells them apart. Every legitimate request must be
// answered; latencies are printed (p50, p99, max), never asserted.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "http/http_test_util.h"
#include "idem/sqlite/store.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

constexpr char kCharge[] = R"({"amount":4000,"currency":"usd","customer":"cus_1"})";

// A TCP connection to 127.0.0.1:port from `source` (an address of 127/8);
// -1 when it cannot be made.
int ConnectFrom(const char* source, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` (or reset it): what it sent is read away.
bool ClosedByServer(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
}

// A slowloris from `source`: `connections` connections, each sending the
// next piece of a request every `interval_ms` and never its end. Half send a
// head line by line; the other half a whole head of POST /charges (an
// Idempotency-Key of "evil-...", a Content-Length of 64) and then its body a
// byte at a time. A connection the server closed is opened again, so the
// count stays up. Stops (closing them all) when destroyed.
class Slowloris {
 public:
  Slowloris(const char* source, int port, int connections, int64_t interval_ms = 500)
      : source_(source), port_(port), interval_ms_(interval_ms), conns_(static_cast<size_t>(connections)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Slowloris() {
    stop_ = true;
    thread_.join();
    for (Conn& c : conns_)
      if (c.fd >= 0) ::close(c.fd);
  }
  int64_t reconnects() const { return reconnects_; }
  // Connections open at least once, and pieces sent.
  int64_t opened() const { return opened_; }

 private:
  struct Conn {
    int fd = -1;
    int step = 0;
  };

  std::string Piece(size_t i, Conn& c) {
    const bool body = i % 2 == 1;
    if (c.step == 0) {
      if (!body) return "GET /health HTTP/1.1\r\nHost: x\r\n";
      return "POST /charges HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk_a\r\nIdempotency-Key: \"evil-" +
             std::to_string(i) + "-" + std::to_string(reconnects_) +
             "\"\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n{";
    }
    if (!body) return "X-Slow-" + std::to_string(c.step) + ": a\r\n";
    return c.step < 60 ? " " : "";  // never the 64th byte
  }

  void Run() {
    while (!stop_) {
      for (size_t i = 0; i < conns_.size() && !stop_; ++i) {
        Conn& c = conns_[i];
        if (c.fd >= 0 && ClosedByServer(c.fd)) {
          ::close(c.fd);
          c = Conn{};
          ++reconnects_;
        }
        if (c.fd < 0) {
          c.fd = ConnectFrom(source_, port_);
          if (c.fd < 0) continue;
          ++opened_;
        }
        const std::string piece = Piece(i, c);
        ++c.step;
        if (!piece.empty()) (void)!::send(c.fd, piece.data(), piece.size(), MSG_NOSIGNAL);
      }
      for (int64_t slept = 0; slept < interval_ms_ && !stop_; slept += 50)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  const char* source_;
  int port_;
  int64_t interval_ms_;
  std::vector<Conn> conns_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> reconnects_{0}, opened_{0};
  std::thread thread_;
};

// A connection flood from `source`: one thread keeps `idle` connections open
// that send nothing (reopening what the server closes), another connects and
// closes at once, over and over.
class Flood {
 public:
  Flood(const char* source, int port, int idle) : source_(source), port_(port), idle_(static_cast<size_t>(idle), -1) {
    holder_ = std::thread([this] { Hold(); });
    churner_ = std::thread([this] { Churn(); });
  }
  ~Flood() {
    stop_ = true;
    holder_.join();
    churner_.join();
    for (int fd : idle_)
      if (fd >= 0) ::close(fd);
  }
  int64_t connects() const { return connects_; }

 private:
  void Hold() {
    while (!stop_) {
      for (int& fd : idle_) {
        if (fd >= 0 && ClosedByServer(fd)) {
          ::close(fd);
          fd = -1;
        }
        if (fd < 0 && (fd = ConnectFrom(source_, port_)) >= 0) ++connects_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  void Churn() {
    while (!stop_) {
      const int fd = ConnectFrom(source_, port_);
      if (fd < 0) continue;
      ++connects_;
      ::close(fd);
    }
  }

  const char* source_;
  int port_;
  std::vector<int> idle_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> connects_{0};
  std::thread holder_, churner_;
};

// Each reply of `n` POST /charges (a fresh connection each, keys `prefix`-i)
// and its latency; prints p50, p99 and max under `label`.
std::vector<Reply> LegitimateCharges(int port, const std::string& prefix, int n, const std::string& label) {
  std::vector<Reply> replies;
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    const auto start = std::chrono::steady_clock::now();
    replies.push_back(
        Send(port, "POST", "/charges", Headers("sk_a", Quoted(prefix + "-" + std::to_string(i))), kCharge));
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) {
    return ms[std::min(ms.size() - 1, static_cast<size_t>(q * static_cast<double>(ms.size())))];
  };
  std::printf("[ hostile ] %s: %d legitimate requests, p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", label.c_str(), n,
              at(0.50), at(0.99), ms.back());
  return replies;
}

// Rows of the store: charges and idempotency records, all and the
// attackers' ("evil-" keys).
struct Rows {
  int64_t charges = -1, evil_charges = -1, claims = -1, evil_claims = -1;
};
Rows CountRows(Store& store) {
  Rows out;
  auto tx = store.Begin();
  EXPECT_OK(tx);
  if (!tx.ok()) return out;
  auto count = [&](const char* sql) {
    auto rows = (*tx)->Query(sql, {});
    EXPECT_OK(rows);
    return rows.ok() ? rows->rows[0][0].AsInt() : -1;
  };
  out.charges = count("SELECT count(*) FROM charges");
  out.evil_charges = count("SELECT count(*) FROM charges WHERE k LIKE 'evil-%'");
  out.claims = count("SELECT count(*) FROM idem_claims");
  out.evil_claims = count("SELECT count(*) FROM idem_claims WHERE CAST(key AS TEXT) LIKE '%evil-%'");
  return out;
}

// Waits (no bound but the test's timeout) until `done` holds.
template <typename F>
void WaitUntil(F done) {
  while (!done()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// How requests are served: on threads, or (group commit) on fibers.
struct Serving {
  const char* name;
  int fibers;
};
std::string ServingName(const ::testing::TestParamInfo<Serving>& p) { return p.param.name; }

class HostileMiddlewareTest : public ::testing::TestWithParam<Serving> {
 protected:
  void Start(int64_t request_deadline_ms) {
    auto s = sqlite::Store::Open({.path = dir_.File("idem.db")});
    ASSERT_OK(s);
    store_ = std::move(*s);
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    ASSERT_TRUE((*tx)->Exec("CREATE TABLE charges(k TEXT PRIMARY KEY)", {}).ok());
    ASSERT_OK((*tx)->Commit());
    claims_ = std::make_unique<Claims>(*store_->claim_store());
    const bool fibers = GetParam().fibers > 0;  // fibers are for group commit
    idem_ = OpenMiddleware(*claims_, http::BearerKeys({{"sk_a", "acct_a"}}),
                           http::Idempotency::Options{.group_commit_max = fibers ? 16 : 0});
    ASSERT_NE(idem_, nullptr);
    server_ = std::make_unique<LoopbackServer>(idem::httplib::Server::Options{
        .request_deadline_ms = request_deadline_ms, .threads = 32, .fibers = GetParam().fibers});
    auto charge = [](const ::httplib::Request&, ::httplib::Response& res, Transaction& tx) {
      Value row[] = {http::CurrentClaim()->key};
      res.status = tx.Exec("INSERT INTO charges(k) VALUES ($1)", row).ok() ? 201 : 500;
    };
    server_->server().Post("/charges", Must(idem::httplib::WrapInTransaction(*idem_, "/charges", {}, *store_, charge)));
    server_->Start();
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  int port() const { return server_->port(); }

  TempDir dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Claims> claims_;
  std::unique_ptr<http::Idempotency> idem_;
  std::unique_ptr<LoopbackServer> server_;
};

INSTANTIATE_TEST_SUITE_P(Middleware, HostileMiddlewareTest,
                         ::testing::Values(Serving{"Threads", 0}, Serving{"GroupCommitOnFibers", 2}), ServingName);

// 256 slowloris connections (the default per-address bound admits them all)
// while 200 legitimate charges go through: each is answered 201, the
// attackers' connections are closed at the deadline (1 s here) and come back,
// and nothing of their half requests is stored.
TEST_P(HostileMiddlewareTest, ASlowlorisOf256ConnectionsStarvesNoRequest) {
  constexpr int kLegitimate = 200;
  Start(/*request_deadline_ms=*/1000);
  std::vector<Reply> replies;
  {
    Slowloris attack("127.0.0.2", port(), 256);
    WaitUntil([&] { return attack.opened() >= 256; });
    replies = LegitimateCharges(port(), "legit", kLegitimate,
                                std::string("slowloris of 256 connections, ") + GetParam().name);
    // Every attacker was closed at its deadline at least once.
    WaitUntil([&] { return server_->counters().deadline_closes >= 256; });
  }
  for (const Reply& r : replies) {
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.status, 201) << r.body;
  }
  WaitUntil([&] { return server_->counters().open == 0; });
  server_->Stop();
  const Rows rows = CountRows(*store_);
  EXPECT_EQ(rows.charges, kLegitimate);
  EXPECT_EQ(rows.claims, kLegitimate);
  EXPECT_EQ(rows.evil_charges, 0);
  EXPECT_EQ(rows.evil_claims, 0);
}

// A flood: 512 connections that send nothing (the per-address bound of 256
// refuses the rest with 503) and connects closed at once, while 200
// legitimate charges go through from another address: each is answered 201.
TEST_P(HostileMiddlewareTest, AConnectionFloodStarvesNoRequest) {
  constexpr int kLegitimate = 200;
  Start(/*request_deadline_ms=*/10'000);
  std::vector<Reply> replies;
  {
    Flood flood("127.0.0.3", port(), 512);
    WaitUntil([&] { return server_->counters().refused > 0; });
    replies = LegitimateCharges(port(), "legit", kLegitimate, std::string("connection flood, ") + GetParam().name);
  }
  for (const Reply& r : replies) {
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.status, 201) << r.body;
  }
  server_->Stop();
  const Rows rows = CountRows(*store_);
  EXPECT_EQ(rows.charges, kLegitimate);
  EXPECT_EQ(rows.claims, kLegitimate);
}

// The server's own cases, with requests on threads and on fibers.
// Reads what the server sends on `fd` until it closes.
std::string ReadToClose(int fd) {
  std::string out;
  char buf[1024];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

class HostileServerTest : public ::testing::TestWithParam<Serving> {
 protected:
  void Start(idem::httplib::Server::Options options) {
    options.fibers = GetParam().fibers;
    server_ = std::make_unique<LoopbackServer>(options);
    server_->server().Get("/health", [this](const ::httplib::Request&, ::httplib::Response& res) {
      ++handled_;
      res.set_content("healthy", "text/plain");
    });
    server_->server().Post("/charges", [this](const ::httplib::Request&, ::httplib::Response& res) {
      ++handled_;
      res.status = 201;
    });
    server_->Start();
  }
  Reply Health() { return Send(server_->port(), "GET", "/health", {}); }
  // A connection from `from` is answered 503 with Retry-After and closed:
  // the first refusal of the test.
  void ExpectRefused503From(const char* from) {
    const int over = ConnectFrom(from, server_->port());
    ASSERT_GE(over, 0);
    const std::string answer = ReadToClose(over);
    ::close(over);
    EXPECT_EQ(answer.rfind("HTTP/1.1 503 ", 0), 0u) << answer;
    EXPECT_NE(answer.find("\r\nRetry-After: 1\r\n"), std::string::npos) << answer;
    EXPECT_EQ(server_->counters().refused, 1);
  }

  std::unique_ptr<LoopbackServer> server_;
  std::atomic<int> handled_{0};
};

INSTANTIATE_TEST_SUITE_P(Server, HostileServerTest, ::testing::Values(Serving{"Threads", 0}, Serving{"Fibers", 1}),
                         ServingName);

// One thread (or one fiber thread) serves: connections that have sent half a
// request each hold none of it, so a whole request is still answered.
TEST_P(HostileServerTest, HalfRequestsHoldNoThread) {
  Start({.threads = 1});
  std::vector<int> slow;
  for (int i = 0; i < 8; ++i) {
    const int fd = ConnectFrom("127.0.0.2", server_->port());
    ASSERT_GE(fd, 0);
    const std::string half = i % 2 == 0 ? "GET /health HTTP/1.1\r\nHost: x\r\n"
                                        : "POST /charges HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345";
    ASSERT_EQ(::send(fd, half.data(), half.size(), MSG_NOSIGNAL), static_cast<ssize_t>(half.size()));
    slow.push_back(fd);
  }
  WaitUntil([&] { return server_->counters().accepted >= 8; });
  const Reply r = Health();
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(handled_, 1);
  for (int fd : slow) ::close(fd);
}

// A request whose head comes a line every 50 ms (each read well within the
// read timeout) is closed at its deadline, unanswered, and no handler runs;
// so is one whose body stops short.
TEST_P(HostileServerTest, ARequestPastItsDeadlineIsClosedUnanswered) {
  Start({.request_deadline_ms = 300});
  for (const bool body : {false, true}) {
    const int fd = ConnectFrom("127.0.0.2", server_->port());
    ASSERT_GE(fd, 0);
    std::string first =
        body ? "POST /charges HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345" : "GET /health HTTP/1.1\r\n";
    ASSERT_GT(::send(fd, first.data(), first.size(), MSG_NOSIGNAL), 0);
    std::string answer;
    for (int line = 0;; ++line) {
      char buf[256];
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;  // closed
        answer.append(buf, static_cast<size_t>(n));
      }
      const std::string more = body ? "" : "X-Slow-" + std::to_string(line) + ": a\r\n";
      if (!more.empty() && ::send(fd, more.data(), more.size(), MSG_NOSIGNAL) < 0) break;
    }
    ::close(fd);
    EXPECT_EQ(answer, "") << (body ? "body" : "head");
  }
  EXPECT_EQ(handled_, 0);
  EXPECT_EQ(server_->counters().deadline_closes, 2);
  const Reply r = Health();  // the server goes on
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.status, 200);
}

// Over the per-address bound a connection is answered 503 with Retry-After
// and closed; another address is served; a place given back is taken again.
TEST_P(HostileServerTest, OverThePerAddressBoundIsRefused503) {
  Start({.max_connections_per_client = 4});
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(ConnectFrom("127.0.0.2", server_->port()));
  for (int fd : held) ASSERT_GE(fd, 0);
  WaitUntil([&] { return server_->counters().open == 4; });
  ExpectRefused503From("127.0.0.2");
  const Reply other = Health();  // from 127.0.0.1
  ASSERT_TRUE(other.ok) << other.error;
  EXPECT_EQ(other.status, 200);
  ::close(held.back());
  held.pop_back();
  WaitUntil([&] { return server_->counters().open == 3; });
  const int again = ConnectFrom("127.0.0.2", server_->port());
  ASSERT_GE(again, 0);
  const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_GT(::send(again, request.data(), request.size(), MSG_NOSIGNAL), 0);
  EXPECT_EQ(ReadToClose(again).rfind("HTTP/1.1 200 ", 0), 0u);
  ::close(again);
  for (int fd : held) ::close(fd);
}

// Over the bound in all, any address is refused.
TEST_P(HostileServerTest, OverTheBoundInAllIsRefused503) {
  Start({.max_connections = 3});
  std::vector<int> held;
  for (const char* from : {"127.0.0.2", "127.0.0.3", "127.0.0.4"}) held.push_back(ConnectFrom(from, server_->port()));
  for (int fd : held) ASSERT_GE(fd, 0);
  WaitUntil([&] { return server_->counters().open == 3; });
  ExpectRefused503From("127.0.0.1");
  for (int fd : held) ::close(fd);
}

// A task queue set on native() takes each connection for its life, as
// cpp-httplib's own loop does: requests are still served, the bounds still
// apply, and stop() still returns.
TEST_P(HostileServerTest, ATaskQueueSetOnNativeStillServes) {
  server_ = std::make_unique<LoopbackServer>(
      idem::httplib::Server::Options{.max_connections_per_client = 1, .fibers = GetParam().fibers});
  server_->server().new_task_queue = [] { return new ::httplib::ThreadPool(2); };
  server_->server().Get(
      "/health", [](const ::httplib::Request&, ::httplib::Response& res) { res.set_content("healthy", "text/plain"); });
  server_->Start();
  const int held = ConnectFrom("127.0.0.2", server_->port());
  ASSERT_GE(held, 0);
  WaitUntil([&] { return server_->counters().open == 1; });
  const int over = ConnectFrom("127.0.0.2", server_->port());
  ASSERT_GE(over, 0);
  EXPECT_EQ(ReadToClose(over).rfind("HTTP/1.1 503 ", 0), 0u);
  ::close(over);
  for (int i = 0; i < 3; ++i) {
    const Reply r = Health();
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.status, 200);
  }
  ::close(held);
  server_->Stop();
  EXPECT_EQ(server_->counters().open, 0);
}

TEST(HostileServerOptions, OpenRefusesOptionsOutOfRange) {
  using Options = idem::httplib::Server::Options;
  for (const Options& bad : {Options{.request_deadline_ms = 0}, Options{.max_connections = 0},
                             Options{.max_connections_per_client = -1}, Options{.threads = 0}, Options{.fibers = -1}}) {
    auto s = idem::httplib::Server::Open(bad);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << s.status();
  }
  auto defaults = idem::httplib::Server::Open({});
  EXPECT_OK(defaults);
}

}  // namespace
}  // namespace idem::testing
