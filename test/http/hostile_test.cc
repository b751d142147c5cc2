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
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/http_test_util.h"
#include "idem/sqlite/store.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

constexpr char kCharge[] = R"({"amount":4000,"currency":"usd","customer":"cus_1"})";

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
class HostileServerTest : public ::testing::TestWithParam<Serving> {
 protected:
  // The server first: its threads may still log until it stops.
  ~HostileServerTest() override { server_.reset(); }
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
    // The remote address a handler sees.
    server_->server().Get("/whoami", [](const ::httplib::Request& req, ::httplib::Response& res) {
      res.set_content(req.remote_addr + ":" + std::to_string(req.remote_port), "text/plain");
    });
    server_->Start();
  }
  // Options::log, kept for the test to read.
  std::function<void(const std::string&)> Logger() {
    return [this](const std::string& line) {
      std::lock_guard lock(log_mu_);
      log_.push_back(line);
    };
  }
  // Two connections (or requests) per client, 127.0.0.2 a trusted proxy,
  // slow requests held for the test's length, the log kept.
  idem::httplib::Server::Options BehindProxy(bool proxy_protocol) {
    return {.request_deadline_ms = 60'000,
            .max_connections_per_client = 2,
            .trusted_proxies = {"127.0.0.2"},
            .proxy_protocol = proxy_protocol,
            .log = Logger()};
  }
  // How many log lines contain `text`.
  int Logged(const std::string& text) {
    std::lock_guard lock(log_mu_);
    return static_cast<int>(std::count_if(log_.begin(), log_.end(),
                                          [&](const std::string& l) { return l.find(text) != std::string::npos; }));
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
  std::mutex log_mu_;
  std::vector<std::string> log_;
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

// A whole request for GET `path` (the connection closed after it), with
// X-Forwarded-For `xff` unless empty.
std::string Get(const std::string& path, const std::string& xff = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + (xff.empty() ? "" : "X-Forwarded-For: " + xff + "\r\n") +
         "Connection: close\r\n\r\n";
}
// A request whose body never ends (5 bytes of 10): held until its deadline.
std::string SlowPost(const std::string& xff) {
  return "POST /charges HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: " + xff + "\r\nContent-Length: 10\r\n\r\n12345";
}
bool Is(const std::string& answer, int status) {
  return answer.rfind("HTTP/1.1 " + std::to_string(status) + " ", 0) == 0;
}
// Waits until `n` of `fds` have something to read (an answer, or a close),
// and returns those answers (each read to its close; its fd closed and set
// to -1).
std::vector<std::string> AnsweredOf(std::vector<int>& fds, size_t n) {
  auto ready = [&] {
    size_t k = 0;
    for (int fd : fds) {
      pollfd p{fd, POLLIN, 0};
      if (fd >= 0 && ::poll(&p, 1, 0) > 0) ++k;
    }
    return k;
  };
  WaitUntil([&] { return ready() >= n; });
  std::vector<std::string> out;
  for (int& fd : fds) {
    pollfd p{fd, POLLIN, 0};
    if (fd < 0 || ::poll(&p, 1, 0) <= 0) continue;
    out.push_back(ReadToClose(fd));
    ::close(fd);
    fd = -1;
  }
  return out;
}
void CloseAll(const std::vector<int>& fds) {
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
}
// A PROXY protocol v2 header naming `a.b.c.d`:`port` (TCP over IPv4) as the
// client.
std::string ProxyV2(uint8_t a, uint8_t b, uint8_t c, uint8_t d, uint16_t port, int version = 2) {
  std::string h("\r\n\r\n\0\r\nQUIT\n", 12);
  h += static_cast<char>((version << 4) | 1);  // PROXY
  h += '\x11';                                 // TCP over IPv4
  h += std::string("\0\x0c", 2);
  for (uint8_t byte : {a, b, c, d, uint8_t{127}, uint8_t{0}, uint8_t{0}, uint8_t{1}}) h += static_cast<char>(byte);
  h += static_cast<char>(port >> 8);
  h += static_cast<char>(port & 0xff);
  return h + std::string("\0\x50", 2);
}

// Behind a load balancer (a trusted proxy, 127.0.0.2) every client has its
// address. Eight slow requests of one client (bodies that never end), each
// on a connection of its own, take that client's 4 places (the other 4 are
// answered 503); another client behind the same balancer, and the balancer's
// own requests (no X-Forwarded-For), are still served. Without the trusted
// proxy every connection from 127.0.0.2 past the 4th would be refused.
TEST_P(HostileServerTest, SlowClientsBehindATrustedProxyStarveNoOtherClientOfIt) {
  Start({.request_deadline_ms = 60'000, .max_connections_per_client = 4, .trusted_proxies = {"127.0.0.2"}});
  const int port = server_->port();
  std::vector<int> slow;
  for (int i = 0; i < 8; ++i) slow.push_back(SendFrom("127.0.0.2", port, SlowPost("198.51.100.1, 203.0.113.7")));
  for (int fd : slow) ASSERT_GE(fd, 0);
  for (const std::string& answer : AnsweredOf(slow, 4)) {
    EXPECT_TRUE(Is(answer, 503)) << answer;
    EXPECT_NE(answer.find("\r\nRetry-After: 1\r\n"), std::string::npos) << answer;
  }
  EXPECT_EQ(server_->counters().refused, 4);
  for (int i = 0; i < 6; ++i) {  // more than 4: each one's place is given back
    const std::string other = AnswerFrom("127.0.0.2", port, Get("/whoami", "203.0.113.8"));
    EXPECT_TRUE(Is(other, 200)) << other;
    EXPECT_NE(other.find("127.0.0.2:"), std::string::npos) << other;  // the peer, as before
    EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", port, Get("/health")), 200));
  }
  EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", port, Get("/health", "203.0.113.7")), 503));  // still over
  EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", port, Get("/health", "203.0.113.7, 127.0.0.2")), 503));
  EXPECT_EQ(server_->counters().refused, 6);
  CloseAll(slow);
  // Its requests ended: the client is served again.
  WaitUntil([&] { return server_->counters().open == 0; });
  EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", port, Get("/health", "203.0.113.7")), 200));
}

// With PROXY protocol the header a trusted proxy sends first names each
// connection's client (v1 and v2 alike): the client's connections past its
// bound are refused, another client's are served and see their own address.
TEST_P(HostileServerTest, ProxyProtocolNamesEachConnectionsClient) {
  Start({.request_deadline_ms = 60'000,
         .max_connections_per_client = 2,
         .trusted_proxies = {"127.0.0.2/32", "10.0.0.0/8"},
         .proxy_protocol = true});
  const int port = server_->port();
  std::vector<int> slow;
  for (int i = 0; i < 4; ++i) {
    const std::string header = i % 2 == 0 ? "PROXY TCP4 203.0.113.7 127.0.0.1 4000" + std::to_string(i) + " 80\r\n"
                                          : ProxyV2(203, 0, 113, 7, static_cast<uint16_t>(40000 + i));
    slow.push_back(SendFrom("127.0.0.2", port, header + "GET /health HTTP/1.1\r\nHost: x\r\n"));  // never ends
  }
  for (int fd : slow) ASSERT_GE(fd, 0);
  for (const std::string& answer : AnsweredOf(slow, 2)) EXPECT_TRUE(Is(answer, 503)) << answer;
  const std::string v1 =
      AnswerFrom("127.0.0.2", port, "PROXY TCP4 198.51.100.9 127.0.0.1 5555 80\r\n" + Get("/whoami"));
  EXPECT_TRUE(Is(v1, 200)) << v1;
  EXPECT_NE(v1.find("\r\n\r\n198.51.100.9:5555"), std::string::npos) << v1;
  const std::string v2 = AnswerFrom("127.0.0.2", port, ProxyV2(198, 51, 100, 9, 4660) + Get("/whoami"));
  EXPECT_TRUE(Is(v2, 200)) << v2;
  EXPECT_NE(v2.find("\r\n\r\n198.51.100.9:4660"), std::string::npos) << v2;
  const std::string over = AnswerFrom("127.0.0.2", port, ProxyV2(203, 0, 113, 7, 1) + Get("/health"));
  EXPECT_TRUE(Is(over, 503)) << over;
  // A header naming no client (v1 UNKNOWN), or another trusted proxy:
  // each request counts for the client its X-Forwarded-For names.
  EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", port, "PROXY UNKNOWN\r\n" + Get("/health", "198.51.100.10")), 200));
  EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", port, "PROXY UNKNOWN\r\n" + Get("/health", "203.0.113.7")), 503));
  EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", port, ProxyV2(10, 1, 1, 1, 1) + Get("/health", "198.51.100.10")), 200));
  EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", port, ProxyV2(10, 1, 1, 1, 1) + Get("/health", "203.0.113.7")), 503));
  // A peer that is not a proxy is served without a header.
  const Reply direct = Health();
  ASSERT_TRUE(direct.ok) << direct.error;
  EXPECT_EQ(direct.status, 200);
  EXPECT_EQ(server_->counters().proxy_refused, 0);
  CloseAll(slow);
}

// A peer that is not a trusted proxy is counted for its own address,
// whatever its X-Forwarded-For says; its PROXY header (v1 or v2) closes the
// connection unanswered, named in the counters and the log.
TEST_P(HostileServerTest, AnUntrustedPeerCannotSpoofItsWayPastItsBound) {
  Start(BehindProxy(/*proxy_protocol=*/true));
  const int port = server_->port();
  std::vector<int> held;
  for (const char* xff : {"198.51.100.1", "198.51.100.2"}) held.push_back(SendFrom("127.0.0.3", port, SlowPost(xff)));
  for (int fd : held) ASSERT_GE(fd, 0);
  WaitUntil([&] { return server_->counters().open == 2; });
  EXPECT_TRUE(Is(AnswerFrom("127.0.0.3", port, Get("/health", "198.51.100.3")), 503));
  for (const std::string& spoof :
       {"PROXY TCP4 198.51.100.9 127.0.0.1 1 80\r\n" + Get("/health"), ProxyV2(198, 51, 100, 9, 1) + Get("/health")})
    EXPECT_EQ(AnswerFrom("127.0.0.4", port, spoof), "");
  EXPECT_EQ(server_->counters().proxy_refused, 2);
  EXPECT_EQ(Logged("connection from 127.0.0.4 closed: a PROXY header from an address that is not a trusted proxy"), 2);
  EXPECT_EQ(handled_, 0);
  CloseAll(held);
}

// A trusted proxy's malformed PROXY header, or none, closes the connection
// unanswered, each named. A malformed X-Forwarded-For (what a client wrote,
// through a proxy that did not append) is named and counts for the proxy's
// own address: it cannot mint a client per request.
TEST_P(HostileServerTest, MalformedProxyHeadersAndForwardedForAreNamedAndHarmless) {
  Start(BehindProxy(/*proxy_protocol=*/true));
  const int port = server_->port();
  for (const std::string& bad :
       {std::string("PROXY TCP4 999.1.1.1 127.0.0.1 1 80\r\n"), std::string("PROXY TCP4 1.2.3.4 127.0.0.1 1 80 x\r\n"),
        std::string("PROXY ") + std::string(200, 'A'), ProxyV2(1, 2, 3, 4, 5, /*version=*/1), std::string()}) {
    EXPECT_EQ(AnswerFrom("127.0.0.2", port, bad + Get("/health")), "") << bad;
  }
  EXPECT_EQ(server_->counters().proxy_refused, 5);
  EXPECT_EQ(Logged("connection from 127.0.0.2 closed: a malformed PROXY header from a trusted proxy: "), 5);
  EXPECT_EQ(Logged("no PROXY header (the connection starts with \"GET /health HTTP\")"), 1);
  EXPECT_EQ(handled_, 0);

  // The same proxy, without PROXY protocol.
  server_.reset();
  Start(BehindProxy(/*proxy_protocol=*/false));
  const int plain = server_->port();
  for (const char* xff : {"unknown", "<script>alert(1)</script>", "203.0.113.7, ", "999.1.1.1"})
    EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", plain, Get("/health", xff)), 200)) << xff;
  EXPECT_EQ(server_->counters().forwarded_for_malformed, 4);
  EXPECT_EQ(Logged("X-Forwarded-For from trusted proxy 127.0.0.2: \"<script>alert(1)</script>\" is not an address; "
                   "the request counts for 127.0.0.2"),
            1);
  std::vector<int> held;
  for (const char* xff : {"garbage-1", "garbage-2"}) held.push_back(SendFrom("127.0.0.2", plain, SlowPost(xff)));
  for (int fd : held) ASSERT_GE(fd, 0);
  WaitUntil([&] { return server_->counters().forwarded_for_malformed == 6; });
  EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", plain, Get("/health", "garbage-3")), 503));
  EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", plain, Get("/health")), 503));  // the proxy's own: the same places
  EXPECT_TRUE(Is(AnswerFrom("127.0.0.2", plain, Get("/health", "203.0.113.7")), 200));
  CloseAll(held);
}

TEST(HostileServerOptions, OpenRefusesOptionsOutOfRange) {
  using Options = idem::httplib::Server::Options;
  for (const Options& bad :
       {Options{.request_deadline_ms = 0}, Options{.max_connections = 0}, Options{.max_connections_per_client = -1},
        Options{.threads = 0}, Options{.fibers = -1}, Options{.trusted_proxies = {"10.0.0.0/8", "10.0.0.0/33"}},
        Options{.trusted_proxies = {"lb.internal"}}, Options{.proxy_protocol = true}}) {
    auto s = idem::httplib::Server::Open(bad);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << s.status();
  }
  auto defaults = idem::httplib::Server::Open({});
  EXPECT_OK(defaults);
}

}  // namespace
}  // namespace idem::testing
