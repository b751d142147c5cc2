// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Helpers for the HTTP tests: a real ::httplib::Server on 127.0.0.1 (any free
// port) on a thread of its own, a gate a handler blocks on until the test
// opens it, a plain request helper (one fresh ::httplib::Client per request),
// a ClaimStore that forwards to another and reports what TryClaim answered,
// and an Env whose backoffs run a hook (so a retrying client's backoff never
// really sleeps and the test decides what happens between two attempts).
#ifndef IDEM_TEST_HTTP_HTTP_TEST_UTIL_H_
#define IDEM_TEST_HTTP_HTTP_TEST_UTIL_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "idem/claims.h"
#include "idem/env.h"
#include "idem/http/idempotency.h"
#include "idem/httplib/middleware.h"
#include "idem/httplib/server.h"
#include "idem/testing/fake_env.h"

namespace idem::testing {

// A server (idem::httplib::Server, cpp-httplib's with idem's connection loop)
// listening on 127.0.0.1:<any free port>, served on its own thread; stopped
// (and joined) by the destructor. Its requests run on `threads` threads
// (Server::Options::threads).
class LoopbackServer {
 public:
  explicit LoopbackServer(int threads = 64) : LoopbackServer(idem::httplib::Server::Options{.threads = threads}) {}
  explicit LoopbackServer(const idem::httplib::Server::Options& options)
      : own_(OpenServer(options)), server_(own_->native()) {
    // Not cpp-httplib's default (SO_REUSEPORT: a busy port would be shared);
    // and note the socket, to listen on it with a longer backlog below.
    server_.set_socket_options([this](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      listen_fd_ = sock;
    });
  }
  ~LoopbackServer() { Stop(); }
  ::httplib::Server& server() { return server_; }
  // idem::httplib::Server::set_fibers (call before Start).
  void set_fibers(int threads) { ASSERT_TRUE(own_->set_fibers(threads).ok()); }
  idem::httplib::Server::Counters counters() const { return own_->counters(); }

  // Binds and starts serving. Connections are queued from the bind on; this
  // returns once the accept loop runs.
  void Start() {
    port_ = server_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0) << "cannot bind 127.0.0.1";
    StartBound();
  }
  // Binds a given port (which must be free) and starts serving.
  void StartOn(int port) {
    ASSERT_TRUE(server_.bind_to_port("127.0.0.1", port)) << "cannot bind 127.0.0.1:" << port;
    port_ = port;
    StartBound();
  }
  void Stop() {
    if (thread_.joinable()) {
      server_.stop();
      thread_.join();
    }
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  void StartBound() {
    // cpp-httplib 0.11 listens with a backlog of 5: a burst of connections
    // overflows it and the kernel resets some. Listening again only raises it.
    ASSERT_NE(listen_fd_, INVALID_SOCKET);
    ASSERT_EQ(::listen(listen_fd_, SOMAXCONN), 0);
    ended_ = std::make_shared<std::atomic<bool>>(false);
    thread_ = std::thread([this, ended = ended_] {
      server_.listen_after_bind();
      ended->store(true);
    });
    while (!server_.is_running() && !ended_->load()) std::this_thread::yield();
    ASSERT_FALSE(ended_->load()) << "the server stopped at once";
  }

  // The server Options make (the test fails if they cannot; it then has the
  // defaults).
  static std::unique_ptr<idem::httplib::Server> OpenServer(const idem::httplib::Server::Options& options) {
    auto server = idem::httplib::Server::Open(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? std::move(*server) : std::make_unique<idem::httplib::Server>();
  }

  std::unique_ptr<idem::httplib::Server> own_;
  ::httplib::Server& server_;
  std::thread thread_;
  std::shared_ptr<std::atomic<bool>> ended_;
  socket_t listen_fd_ = INVALID_SOCKET;
  int port_ = 0;
};

// The middleware on `claims`, opened (the test fails when it cannot be).
inline std::unique_ptr<http::Idempotency> OpenMiddleware(Claims& claims, http::Authenticator authenticate,
                                                         http::Idempotency::Options options = {}) {
  options.claims = &claims;
  options.authenticate = std::move(authenticate);
  auto m = http::Idempotency::Open(options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// A route's handler from a Wrap that must succeed (the test fails if not;
// the handler then answers 599).
inline ::httplib::Server::Handler Must(Result<::httplib::Server::Handler> handler) {
  EXPECT_TRUE(handler.ok()) << handler.status();
  if (handler.ok()) return std::move(*handler);
  return [](const ::httplib::Request&, ::httplib::Response& res) { res.status = 599; };
}

// A gate handlers block on until the test opens it; the test can wait until
// `n` handlers have arrived at it.
class Gate {
 public:
  // Called by the blocked side: counts the arrival, waits for Open().
  void Arrive() {
    std::unique_lock lock(mu_);
    ++arrived_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void WaitArrived(int n = 1) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return arrived_ >= n; });
  }
  bool is_open() {
    std::lock_guard lock(mu_);
    return open_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  bool open_ = false;
};

// A one-shot countdown: Wait() returns once CountDown() was called `n` times.
class Latch {
 public:
  explicit Latch(int n) : left_(n) {}
  void CountDown() {
    std::lock_guard lock(mu_);
    if (--left_ <= 0) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return left_ <= 0; });
  }
  void ArriveAndWait() {
    std::unique_lock lock(mu_);
    if (--left_ <= 0) cv_.notify_all();
    cv_.wait(lock, [&] { return left_ <= 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
};

// One HTTP exchange's outcome.
struct Reply {
  bool ok = false;  // a response arrived (false: connection error)
  std::string error;
  int status = 0;
  ::httplib::Headers headers;
  std::string body;

  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
  bool has(const std::string& name) const { return headers.count(name) > 0; }
  bool replayed() const { return header("Idempotent-Replayed") == "true"; }
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false); }
};

inline Reply ToReply(const ::httplib::Result& r) {
  Reply out;
  if (!r) {
    out.error = ::httplib::to_string(r.error());
    return out;
  }
  out.ok = true;
  out.status = r->status;
  out.headers = r->headers;
  out.body = r->body;
  return out;
}

// Sends one request on a fresh connection. `headers` go as given (a
// multimap: two entries of one name are sent as two header lines).
inline Reply Send(int port, const std::string& method, const std::string& path, const ::httplib::Headers& headers,
                  const std::string& body = "", const std::string& content_type = "application/json") {
  ::httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(std::chrono::seconds(30));
  c.set_read_timeout(std::chrono::seconds(120));
  if (method == "POST") return ToReply(c.Post(path.c_str(), headers, body, content_type.c_str()));
  if (method == "PUT") return ToReply(c.Put(path.c_str(), headers, body, content_type.c_str()));
  if (method == "PATCH") return ToReply(c.Patch(path.c_str(), headers, body, content_type.c_str()));
  if (method == "DELETE") return ToReply(c.Delete(path.c_str(), headers, body, content_type.c_str()));
  return ToReply(c.Get(path.c_str(), headers));
}

// Authorization + a quoted Idempotency-Key (raw: the header value as given).
inline ::httplib::Headers Headers(const std::string& bearer, std::optional<std::string> raw_key) {
  ::httplib::Headers h;
  if (!bearer.empty()) h.emplace("Authorization", "Bearer " + bearer);
  if (raw_key) h.emplace("Idempotency-Key", *raw_key);
  return h;
}
inline std::string Quoted(const std::string& key) { return "\"" + key + "\""; }

// Whether two replies are the same response as far as a client can tell:
// status, body bytes, and the headers that carry meaning.
inline void ExpectSameResponse(const Reply& first, const Reply& again) {
  EXPECT_EQ(again.status, first.status);
  EXPECT_EQ(again.body, first.body);
  for (const char* h : {"Location", "Content-Type"}) EXPECT_EQ(again.header(h), first.header(h)) << h;
}

// Forwards every call to `inner`; calls `on_try` with each TryClaim outcome
// and `on_count` before each CountClaims.
class ObservedClaimStore final : public ClaimStore {
 public:
  explicit ObservedClaimStore(ClaimStore& inner) : inner_(inner) {}

  std::function<void(const ClaimRequest&, const Result<ClaimOutcome>&)> on_try;
  std::function<void(std::string_view scope)> on_count;

  Result<ClaimOutcome> TryClaim(const ClaimRequest& request) override {
    Result<ClaimOutcome> r = inner_.TryClaim(request);
    if (on_try) on_try(request, r);
    return r;
  }
  Status Complete(const ClaimToken& token, std::string_view result, bool is_error, int64_t retention_ms) override {
    return inner_.Complete(token, result, is_error, retention_ms);
  }
  Status Release(const ClaimToken& token) override { return inner_.Release(token); }
  Result<int64_t> Extend(const ClaimToken& token, int64_t lease_ms) override { return inner_.Extend(token, lease_ms); }
  Result<std::optional<ClaimRecord>> FindClaim(std::string_view scope, std::string_view key) override {
    return inner_.FindClaim(scope, key);
  }
  Result<std::vector<ClaimRecord>> ListClaims(std::string_view scope, int limit) override {
    return inner_.ListClaims(scope, limit);
  }
  Result<int64_t> CountClaims(std::string_view scope) override {
    if (on_count) on_count(scope);
    return inner_.CountClaims(scope);
  }
  Result<int64_t> PurgeClaims(std::string_view scope, int64_t abandoned_after_ms, int batch_size) override {
    return inner_.PurgeClaims(scope, abandoned_after_ms, batch_size);
  }
  Result<int64_t> NowMs() override { return inner_.NowMs(); }
  std::unique_ptr<Watch> WatchKey(std::string_view scope, std::string_view key) override {
    return inner_.WatchKey(scope, key);
  }

 private:
  ClaimStore& inner_;
};

// A fake clock for idem::http::Client whose sleeps only advance it, so a
// retrying client runs without real sleeps. The client draws one random
// number (its jitter) per backoff and then sleeps that backoff in slices of
// at most 50 ms: each draw starts a backoff, and sleeps() reports each
// backoff's total, slices() every SleepMs call.
class HookedEnv final : public Env {
 public:
  int64_t NowMs() override { return clock_.NowMs(); }
  uint64_t Random() override {
    std::function<void(int n)> hook;
    int n = 0;
    {
      std::lock_guard lock(mu_);
      sleeps_.push_back(0);
      n = static_cast<int>(sleeps_.size());
      hook = on_sleep_;
    }
    if (hook) hook(n);
    return clock_.Random();
  }
  void SleepMs(int64_t ms) override {
    std::function<void(int n)> hook;
    int n = 0;
    {
      std::lock_guard lock(mu_);
      if (sleeps_.empty()) sleeps_.push_back(0);
      sleeps_.back() += ms;
      slices_.push_back(ms);
      n = static_cast<int>(slices_.size());
      hook = on_slice_;
    }
    clock_.Advance(ms);
    if (hook) hook(n);
  }
  // Runs after the n-th slice (1-based) of any backoff.
  void OnSlice(std::function<void(int n)> hook) {
    std::lock_guard lock(mu_);
    on_slice_ = std::move(hook);
  }
  // Runs as the n-th backoff (1-based) begins, between attempt n and n + 1.
  void OnSleep(std::function<void(int n)> hook) {
    std::lock_guard lock(mu_);
    on_sleep_ = std::move(hook);
  }
  // The backoffs, each the sum of its slices.
  std::vector<int64_t> sleeps() {
    std::lock_guard lock(mu_);
    return sleeps_;
  }
  std::vector<int64_t> slices() {
    std::lock_guard lock(mu_);
    return slices_;
  }

 private:
  FakeEnv clock_;
  std::mutex mu_;
  std::vector<int64_t> sleeps_;
  std::vector<int64_t> slices_;
  std::function<void(int)> on_sleep_;
  std::function<void(int)> on_slice_;
};

// Raw loopback connections from any address of 127/8 (so a server's
// per-address bounds and trusted proxies tell them apart).
// A TCP connection to 127.0.0.1:port from `source` (an address of 127/8);
// -1 when it cannot be made.
inline int ConnectFrom(const char* source, int port) {
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

// Reads what the server sends on `fd` until it closes.
inline std::string ReadToClose(int fd) {
  std::string out;
  char buf[1024];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// A connection from `from` that has sent `bytes`.
inline int SendFrom(const char* from, int port, const std::string& bytes) {
  const int fd = ConnectFrom(from, port);
  if (fd >= 0 && ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}
// What the server answers to `bytes` sent from `from` (until it closes).
inline std::string AnswerFrom(const char* from, int port, const std::string& bytes) {
  const int fd = SendFrom(from, port, bytes);
  if (fd < 0) return "(no connection)";
  std::string answer = ReadToClose(fd);
  ::close(fd);
  return answer;
}

}  // namespace idem::testing

#endif  // IDEM_TEST_HTTP_HTTP_TEST_UTIL_H_
