// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::httplib::Gateway and `idem gateway` in front of a real upstream (a
// cpp-httplib server on 127.0.0.1 that counts its calls), on SQLite and on
// the throwaway PostgreSQL (CTest fixture "postgres"). The crash cases run
// the idem command (IDEM_CLI) with a kill point armed and SIGKILL it between
// forwarding and storing.
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "http/http_test_util.h"
#include "idem/claims.h"
#include "idem/httplib/gateway.h"
#include "idem/httplib/metrics_endpoint.h"
#include "idem/httplib/middleware.h"
#include "idem/open.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/throwaway.h"
#include "postgres/pg_test_util.h"
#include "util/test_servers.h"

extern char** environ;

namespace idem::testing {
namespace {

// The API behind the gateway: POST/PATCH anywhere answers 201 with the call's
// number, a Location, a Set-Cookie and a header outside the stored set;
// /big answers a body of `big` bytes; /fail answers 500; /slow never answers before the client
// gives up (its handler waits for the test's release). Every call is counted,
// with the Idempotency-Key it carried.
class Upstream {
 public:
  Upstream() : server_(64) {
    auto handle = [this](const ::httplib::Request& req, ::httplib::Response& res) {
      int n;
      {
        std::lock_guard lock(mu_);
        n = ++calls_;
        keys_.push_back(req.get_header_value("Idempotency-Key"));
        paths_.push_back(req.method + " " + req.path);
      }
      if (req.path == "/slow") {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return released_; });
        return;
      }
      if (req.path == "/fail") {  // fails after acting: the call is counted
        res.status = 500;
        res.set_content("{\"error\":\"boom\",\"call\":" + std::to_string(n) + "}", "application/json");
        return;
      }
      res.status = 201;
      res.set_header("Location", "/charges/ch_" + std::to_string(n));
      res.set_header("Set-Cookie", "session=secret-" + std::to_string(n));
      res.set_header("X-Call", std::to_string(n));
      if (req.path == "/big") {
        res.set_content(std::string(4096, 'x'), "text/plain");
        return;
      }
      res.set_content("{\"call\":" + std::to_string(n) + ",\"echo\":" + (req.body.empty() ? "null" : req.body) + "}",
                      "application/json");
    };
    server_.server().Post(".*", handle);
    server_.server().Patch(".*", handle);
    server_.server().Get(".*", [this](const ::httplib::Request&, ::httplib::Response& res) {
      std::lock_guard lock(mu_);
      ++gets_;
      res.set_content("plain", "text/plain");
    });
    server_.Start();
  }
  ~Upstream() {
    Release();
    server_.Stop();
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  int calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }
  int gets() {
    std::lock_guard lock(mu_);
    return gets_;
  }
  std::vector<std::string> keys() {
    std::lock_guard lock(mu_);
    return keys_;
  }
  std::string url() const { return server_.url(); }

 private:
  LoopbackServer server_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  int calls_ = 0, gets_ = 0;
  std::vector<std::string> keys_, paths_;
};

// A store for the gateway's keys: a SQLite file, or a fresh PostgreSQL schema.
std::string StoreUrl(const std::string& kind, const TempDir& dir) {
  return kind == "sqlite" ? "sqlite:" + dir.File("gateway.db") : FreshSchemaUrl();
}

struct Reply {
  int status = 0;  // 0: no answer (the connection closed)
  std::string body;
  ::httplib::Headers headers;
  std::string Header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

Reply Send(int port, const std::string& method, const std::string& path, const std::string& body,
           const std::string& key, const std::string& principal = "Bearer sk_1") {
  ::httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(std::chrono::seconds(30));
  ::httplib::Headers h;
  if (!key.empty()) h.emplace("Idempotency-Key", key);
  if (!principal.empty()) h.emplace("Authorization", principal);
  ::httplib::Request req;
  req.method = method;
  req.path = path;
  req.headers = h;
  req.body = body;
  if (!body.empty()) req.headers.emplace("Content-Type", "application/json");
  auto r = c.send(req);
  Reply out;
  if (!r) {
    out.body = ::httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  out.body = r->body;
  out.headers = r->headers;
  return out;
}

// A gateway in this process on `store_url`, served on a thread of its own.
class InProcess {
 public:
  InProcess(const std::string& store_url, idem::httplib::Gateway::Options o) : InProcess(Opened(store_url), {}, o) {}
  // On `store` with `claims` over it (default Claims when null).
  InProcess(std::unique_ptr<Store> store, std::unique_ptr<Claims> claims, idem::httplib::Gateway::Options o)
      : store_(std::move(store)), claims_(std::move(claims)) {
    if (claims_ == nullptr) claims_ = std::make_unique<Claims>(*store_->claim_store());
    o.claims = claims_.get();
    auto g = idem::httplib::Gateway::Open(o);
    EXPECT_TRUE(g.ok()) << g.status();
    gateway_ = std::move(*g);
    thread_ = std::thread([this] { (void)gateway_->Run(); });
    while (!gateway_->server().native().is_running()) std::this_thread::yield();
  }
  ~InProcess() {
    gateway_->Stop();
    thread_.join();
  }
  int port() const { return gateway_->port(); }
  idem::httplib::Gateway& gateway() { return *gateway_; }
  Store& store() { return *store_; }

 private:
  static std::unique_ptr<Store> Opened(const std::string& url) {
    auto s = OpenStore(url);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::unique_ptr<Store> store_;
  std::unique_ptr<Claims> claims_;
  std::unique_ptr<idem::httplib::Gateway> gateway_;
  std::thread thread_;
};

class GatewayTest : public ::testing::TestWithParam<std::string> {
 protected:
  idem::httplib::Gateway::Options Options() {
    idem::httplib::Gateway::Options o;
    o.upstream = upstream_.url();
    return o;
  }
  TempDir dir_;
  Upstream upstream_;
};

TEST_P(GatewayTest, ARepeatIsReplayedWithTheSameStatusHeadersAndBodyAndNeverForwarded) {
  InProcess g(StoreUrl(GetParam(), dir_), Options());
  Reply first = Send(g.port(), "POST", "/charges", R"({"amount":4000})", "order-1");
  ASSERT_EQ(first.status, 201) << first.body;
  EXPECT_EQ(first.Header("Set-Cookie"), "session=secret-1");  // the first client gets every header
  EXPECT_EQ(first.Header("X-Call"), "1");
  EXPECT_EQ(first.Header("Idempotent-Replayed"), "");
  Reply again = Send(g.port(), "POST", "/charges", R"({ "amount" : 4000 })", "order-1");
  EXPECT_EQ(again.status, 201);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(again.Header("Location"), "/charges/ch_1");
  EXPECT_EQ(again.Header("Content-Type"), "application/json");
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(again.Header("Set-Cookie"), "") << "Set-Cookie is not in the stored set";
  EXPECT_EQ(again.Header("X-Call"), "");
  EXPECT_EQ(upstream_.calls(), 1);
  EXPECT_EQ(upstream_.keys(), std::vector<std::string>{"order-1"});  // forwarded with its key
  // Another principal with the same key is another key.
  Reply other = Send(g.port(), "POST", "/charges", R"({"amount":4000})", "order-1", "Bearer sk_2");
  EXPECT_EQ(other.status, 201);
  EXPECT_EQ(other.Header("Idempotent-Replayed"), "");
  EXPECT_EQ(upstream_.calls(), 2);
  EXPECT_EQ(g.gateway().counters().forwarded, 2u);
  EXPECT_EQ(g.gateway().counters().replayed, 1u);
  if (GetParam() == "sqlite") {  // the principal is kept as its SHA-256 only
    std::string bytes;
    for (const char* suffix : {"", "-wal"}) {
      std::ifstream in(dir_.File("gateway.db") + suffix, std::ios::binary);
      bytes += std::string(std::istreambuf_iterator<char>(in), {});
    }
    EXPECT_NE(bytes.find("order-1"), std::string::npos) << "the keys are in this file";
    EXPECT_EQ(bytes.find("sk_1"), std::string::npos);
    EXPECT_EQ(bytes.find("sk_2"), std::string::npos);
  }
}

TEST_P(GatewayTest, TheKeyWithAnotherBodyPathOrMethodIs422AndAMissingKeyOrPrincipalIsRefused) {
  InProcess g(StoreUrl(GetParam(), dir_), Options());
  ASSERT_EQ(Send(g.port(), "POST", "/charges", R"({"amount":4000})", "k").status, 201);
  Reply body = Send(g.port(), "POST", "/charges", R"({"amount":9000})", "k");
  EXPECT_EQ(body.status, 422);
  EXPECT_NE(body.body.find("idempotency-key-reused"), std::string::npos) << body.body;
  EXPECT_EQ(body.Header("Content-Type"), "application/problem+json");
  EXPECT_EQ(Send(g.port(), "POST", "/refunds", R"({"amount":4000})", "k").status, 422);
  EXPECT_EQ(Send(g.port(), "PATCH", "/charges", R"({"amount":4000})", "k").status, 422);
  Reply missing = Send(g.port(), "POST", "/charges", R"({"amount":1})", "");
  EXPECT_EQ(missing.status, 400);
  EXPECT_NE(missing.body.find("idempotency-key-missing"), std::string::npos) << missing.body;
  EXPECT_EQ(Send(g.port(), "POST", "/charges", R"({"amount":1})", "a b").status, 400);  // malformed
  EXPECT_EQ(Send(g.port(), "POST", "/charges", R"({"amount":1})", "k2", "").status, 401);
  EXPECT_EQ(upstream_.calls(), 1);
  // A method not guarded passes through.
  Reply get = Send(g.port(), "GET", "/charges", "", "");
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.body, "plain");
  EXPECT_EQ(upstream_.gets(), 1);
}

TEST_P(GatewayTest, WithPassKeylessARequestWithoutAKeyIsForwardedEveryTime) {
  auto o = Options();
  o.require_key = false;
  o.paths = {"/charges"};
  InProcess g(StoreUrl(GetParam(), dir_), o);
  EXPECT_EQ(Send(g.port(), "POST", "/charges", R"({"a":1})", "").status, 201);
  EXPECT_EQ(Send(g.port(), "POST", "/charges", R"({"a":1})", "").status, 201);
  // A path outside --paths is not guarded: a key there is forwarded each time.
  EXPECT_EQ(Send(g.port(), "POST", "/other", R"({"a":1})", "k").status, 201);
  EXPECT_EQ(Send(g.port(), "POST", "/other", R"({"a":1})", "k").status, 201);
  EXPECT_EQ(upstream_.calls(), 4);
}

TEST_P(GatewayTest, AThousandConcurrentRequestsWithOneKeyMakeOneUpstreamCall) {
  auto o = Options();
  o.max_connections_per_client = 0;  // every client here is 127.0.0.1
  o.max_connections = 2048;
  o.threads = 32;
  InProcess g(StoreUrl(GetParam(), dir_), o);
  constexpr int kRequests = 1000;
  std::vector<Reply> replies(kRequests);
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (int i = 0; i < kRequests; ++i)
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      replies[i] = Send(g.port(), "POST", "/charges", R"({"amount":4000})", "one-key");
    });
  go = true;
  for (auto& t : threads) t.join();
  int created = 0, in_progress = 0;
  std::string body;
  for (const Reply& r : replies) {
    if (r.status == 201) {
      ++created;
      if (body.empty()) body = r.body;
      EXPECT_EQ(r.body, body);
    } else {
      EXPECT_EQ(r.status, 409) << r.body;
      if (r.status != 409) break;
      EXPECT_FALSE(r.Header("Retry-After").empty());
      ++in_progress;
    }
  }
  EXPECT_EQ(created + in_progress, kRequests);
  EXPECT_GE(created, 1);
  EXPECT_EQ(upstream_.calls(), 1);
  EXPECT_EQ(Send(g.port(), "POST", "/charges", R"({"amount":4000})", "one-key").body, body);
  EXPECT_EQ(upstream_.calls(), 1);
}

TEST_P(GatewayTest, AResponseOverTheStoredBoundReachesTheFirstClientAndARepeatGets410) {
  auto o = Options();
  o.max_stored_body = 1024;
  InProcess g(StoreUrl(GetParam(), dir_), o);
  Reply first = Send(g.port(), "POST", "/big", "", "big-1");
  EXPECT_EQ(first.status, 201);
  EXPECT_EQ(first.body, std::string(4096, 'x'));
  Reply again = Send(g.port(), "POST", "/big", "", "big-1");
  EXPECT_EQ(again.status, 410);
  EXPECT_NE(again.body.find("response-not-stored"), std::string::npos) << again.body;
  EXPECT_EQ(upstream_.calls(), 1);
  EXPECT_EQ(g.gateway().counters().not_stored, 1u);
}

TEST_P(GatewayTest, AnUpstreamThatTimesOutLeavesTheKeyUnknownAndItIsNeverForwardedAgain) {
  auto o = Options();
  o.upstream_timeout_ms = 200;
  o.lease_ms = 5'000;
  InProcess g(StoreUrl(GetParam(), dir_), o);
  Reply first = Send(g.port(), "POST", "/slow", R"({"a":1})", "slow-1");
  EXPECT_EQ(first.status, 503);
  EXPECT_NE(first.body.find("outcome-unknown"), std::string::npos) << first.body;
  EXPECT_NE(first.body.find("slow-1"), std::string::npos) << first.body;
  upstream_.Release();
  Reply again = Send(g.port(), "POST", "/slow", R"({"a":1})", "slow-1");
  EXPECT_EQ(again.status, 503);
  EXPECT_NE(again.body.find("outcome-unknown"), std::string::npos) << again.body;
  EXPECT_EQ(upstream_.calls(), 1);
  EXPECT_EQ(g.gateway().counters().outcome_unknown, 1u);
  const std::string metrics = Send(g.port(), "GET", "/metrics", "", "").body;
  EXPECT_NE(metrics.find("idem_gateway_outcome_unknown_total 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("idem_gateway_forwarded_total 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("idem_gateway_request_seconds_count{outcome=\"outcome_unknown\"} 2"), std::string::npos)
      << metrics;
}

TEST_P(GatewayTest, WhenTheUpstreamHonoursKeysATimedOutKeyIsForwardedAgainWithTheSameKey) {
  auto o = Options();
  o.upstream_timeout_ms = 200;
  o.lease_ms = 5'000;
  o.upstream_honours_key = true;
  InProcess g(StoreUrl(GetParam(), dir_), o);
  EXPECT_EQ(Send(g.port(), "POST", "/slow", R"({"a":1})", "slow-2").status, 503);
  upstream_.Release();
  Reply again = Send(g.port(), "POST", "/slow", R"({"a":1})", "slow-2");
  EXPECT_EQ(again.status, 200);  // the released handler answers with nothing set
  EXPECT_EQ(upstream_.keys(), (std::vector<std::string>{"slow-2", "slow-2"}));
}

TEST_P(GatewayTest, AnUnreachableUpstreamFreesTheKey) {
  auto o = Options();
  o.upstream = "http://127.0.0.1:1";  // nothing listens there
  InProcess g(StoreUrl(GetParam(), dir_), o);
  Reply r = Send(g.port(), "POST", "/charges", R"({"a":1})", "down-1");
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_NE(r.body.find("upstream-unavailable"), std::string::npos) << r.body;
  Reply again = Send(g.port(), "POST", "/charges", R"({"a":1})", "down-1");
  EXPECT_EQ(again.status, 502) << again.body;          // not 409, not unknown
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "");  // tried again, not the first 502 replayed
  EXPECT_EQ(g.gateway().counters().upstream_errors, 2u);
  EXPECT_EQ(g.gateway().counters().outcome_unknown, 0u);
}

// The upstream may have acted before it failed: its 5xx is stored and
// replayed, and the key is not forwarded again.
TEST_P(GatewayTest, AnUpstream5xxIsStoredAndReplayedAndNotForwardedAgain) {
  InProcess g(StoreUrl(GetParam(), dir_), Options());
  Reply first = Send(g.port(), "POST", "/fail", R"({"a":1})", "fail-1");
  EXPECT_EQ(first.status, 500) << first.body;
  Reply again = Send(g.port(), "POST", "/fail", R"({"a":1})", "fail-1");
  EXPECT_EQ(again.status, 500) << again.body;
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(upstream_.calls(), 1);
}

TEST_P(GatewayTest, WithForwardAgainAfter5xxARetryAfterAnUpstream5xxIsForwarded) {
  auto o = Options();
  o.forward_again_after_5xx = true;
  InProcess g(StoreUrl(GetParam(), dir_), o);
  EXPECT_EQ(Send(g.port(), "POST", "/fail", R"({"a":1})", "fail-2").status, 500);
  Reply again = Send(g.port(), "POST", "/fail", R"({"a":1})", "fail-2");
  EXPECT_EQ(again.status, 500) << again.body;
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "");
  EXPECT_EQ(upstream_.calls(), 2);
}

// ---- `idem gateway` SIGKILLed at http.before_complete: the upstream answered,
// nothing is stored.

// A port from 28400 on that nothing listens on now.
int FreePort() {
  static std::atomic<int> next{28400 + (::getpid() % 50) * 8};
  for (;;) {
    const int port = next.fetch_add(1);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return port;
  }
}

pid_t SpawnServing(const std::function<std::vector<std::string>(int port)>& argv, const std::string& kill_at,
                   int& port);

// Starts `idem gateway` (with IDEM_KILL_AT=`kill_at` when not empty) and
// returns once it answers.
pid_t StartCli(int& port, const std::string& upstream, const std::string& store, const std::string& kill_at,
               bool honours) {
  return SpawnServing(
      [&](int listen) {
        std::vector<std::string> argv = {IDEM_CLI,
                                         "gateway",
                                         "--listen",
                                         "127.0.0.1:" + std::to_string(listen),
                                         "--upstream",
                                         upstream,
                                         "--store",
                                         store,
                                         "--lease",
                                         "400",
                                         "--upstream-timeout",
                                         "100",
                                         "--connect-timeout",
                                         "100",
                                         "--quiet"};
        if (honours) argv.push_back("--upstream-honours-key");
        return argv;
      },
      kill_at, port);
}

// Whether process `pid` holds the socket listening on `port` (another
// process of the test suite may take a port between FreePort's check and the
// child's bind, and then answers in its place).
bool Listens(pid_t pid, int port) {
  std::set<std::string> inodes;  // of the child's sockets
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // the column names
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    in >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
    if (state != "0A" || local.find(':') == std::string::npos) continue;  // 0A: LISTEN
    if (std::stoi(local.substr(local.find(':') + 1), nullptr, 16) == port && inodes.count(inode)) return true;
  }
  return false;
}

// Starts the idem command `argv(port)` (with IDEM_KILL_AT=`kill_at` when
// not empty) on a free port, and returns once the child listens there and
// GET /metrics answers. A child that could not bind its port (taken
// meanwhile) is started again on another.
pid_t SpawnServing(const std::function<std::vector<std::string>(int port)>& make_argv, const std::string& kill_at,
                   int& port) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string(*e).rfind("IDEM_KILL_AT=", 0) != 0) env_strings.emplace_back(*e);
  if (!kill_at.empty()) env_strings.push_back("IDEM_KILL_AT=" + kill_at);
  std::vector<char*> env;
  for (auto& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  for (int attempt = 0; attempt < 10; ++attempt) {
    port = FreePort();
    std::vector<std::string> argv = make_argv(port);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_t pid = 0;
    EXPECT_EQ(::posix_spawn(&pid, IDEM_CLI, nullptr, nullptr, args.data(), env.data()), 0);
    for (;;) {  // until it serves (or dies)
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) break;
      ::httplib::Client c("127.0.0.1", port);
      if (Listens(pid, port) && c.Get("/metrics")) return pid;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ADD_FAILURE() << make_argv(port)[1] << " exited before serving, on 10 ports";
  return -1;
}

// Sends the key until the answer is not 409 (the dead gateway's lease runs out).
Reply UntilNotInProgress(int port, const std::string& key) {
  for (;;) {
    Reply r = Send(port, "POST", "/charges", R"({"amount":4000})", key);
    if (r.status != 409) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void KilledBetweenForwardingAndStoring(const std::string& store, Upstream& upstream, bool honours) {
  int port = 0;
  pid_t pid = StartCli(port, upstream.url(), store, "http.before_complete", honours);
  ASSERT_GT(pid, 0);
  Reply lost = Send(port, "POST", "/charges", R"({"amount":4000})", "crash-1");
  EXPECT_EQ(lost.status, 0) << "the gateway answered instead of dying: " << lost.body;
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  ASSERT_EQ(upstream.calls(), 1);

  int port2 = 0;
  pid = StartCli(port2, upstream.url(), store, "", honours);
  ASSERT_GT(pid, 0);
  Reply repeat = UntilNotInProgress(port2, "crash-1");
  Reply again = Send(port2, "POST", "/charges", R"({"amount":4000})", "crash-1");
  ::kill(pid, SIGTERM);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  if (!honours) {
    EXPECT_EQ(repeat.status, 503) << repeat.body;
    EXPECT_NE(repeat.body.find("outcome-unknown"), std::string::npos) << repeat.body;
    EXPECT_NE(repeat.body.find("crash-1"), std::string::npos) << repeat.body;
    EXPECT_EQ(again.status, 503) << again.body;
    EXPECT_EQ(again.body, repeat.body);
    EXPECT_EQ(upstream.calls(), 1) << "a key whose outcome is unknown was forwarded again";
  } else {
    EXPECT_EQ(repeat.status, 201) << repeat.body;
    EXPECT_EQ(again.body, repeat.body);
    EXPECT_EQ(upstream.keys(), (std::vector<std::string>{"crash-1", "crash-1"}));
  }
}

TEST_P(GatewayTest, AGatewayKilledBetweenForwardingAndStoringNeverForwardsTheKeyAgain) {
  KilledBetweenForwardingAndStoring(StoreUrl(GetParam(), dir_), upstream_, false);
}

TEST_P(GatewayTest, AGatewayKilledBetweenForwardingAndStoringForwardsAgainWhenTheUpstreamHonoursKeys) {
  KilledBetweenForwardingAndStoring(StoreUrl(GetParam(), dir_), upstream_, true);
}

// A body over the in-memory bound (max_body_bytes), up to max_spooled_body,
// is spooled while its fingerprint is computed, then forwarded once from
// the file, whole; its repeat is replayed, the key with a changed body is
// 422, a body over the spool bound 413. Unguarded, it is streamed through.
TEST_P(GatewayTest, ABodyOverTheInMemoryBoundIsSpooledForwardedOnceAndReplayed) {
  auto o = Options();
  o.paths = {"/charges"};
  o.max_body_bytes = 1024;
  o.max_spooled_body = 1 << 20;
  o.spool_dir = dir_.path();
  InProcess g(StoreUrl(GetParam(), dir_), o);
  const std::string blob(300'000, 'a');
  const std::string big = R"({"blob":")" + blob + R"("})";
  Reply first = Send(g.port(), "POST", "/charges", big, "big-1");
  ASSERT_EQ(first.status, 201) << first.body.substr(0, 500);
  EXPECT_EQ(first.body, R"({"call":1,"echo":)" + big + "}");  // the upstream got it whole
  Reply again = Send(g.port(), "POST", "/charges", big, "big-1");
  EXPECT_EQ(again.status, 201);
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(again.body, first.body);
  std::string changed = big;
  changed[100'000] = 'b';
  Reply reused = Send(g.port(), "POST", "/charges", changed, "big-1");
  EXPECT_EQ(reused.status, 422) << reused.body;
  EXPECT_EQ(upstream_.calls(), 1);
  // Small bodies are still read whole and canonicalised: spacing is the same body.
  ASSERT_EQ(Send(g.port(), "POST", "/charges", R"({"amount":1})", "small-1").status, 201);
  EXPECT_EQ(Send(g.port(), "POST", "/charges", R"({ "amount" : 1 })", "small-1").Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(upstream_.calls(), 2);
  const std::string huge = R"({"blob":")" + std::string(2 << 20, 'c') + R"("})";
  EXPECT_EQ(Send(g.port(), "POST", "/charges", huge, "huge-1").status, 413);
  // Unguarded (outside --paths): streamed straight through, every time.
  for (int i = 0; i < 2; ++i) {
    Reply passed = Send(g.port(), "POST", "/uploads", big, "");
    ASSERT_EQ(passed.status, 201) << passed.body.substr(0, 500);
    EXPECT_EQ(passed.body, R"({"call":)" + std::to_string(3 + i) + R"(,"echo":)" + big + "}");
  }
  EXPECT_EQ(upstream_.calls(), 4);
  EXPECT_EQ(g.gateway().counters().passed, 2u);
  for (const auto& f : std::filesystem::directory_iterator(dir_.path()))  // spool files leave nothing behind
    EXPECT_EQ(f.path().filename().string().rfind("idem-gateway-body", 0), std::string::npos) << f.path();
}

TEST_P(GatewayTest, PastMaxKeysPerPrincipalANewKeyIs429AndStoredKeysStillReplay) {
  idem::httplib::Gateway::Options o = Options();
  o.max_keys_per_principal = 2;
  InProcess g(StoreUrl(GetParam(), dir_), o);
  for (int round = 0; round < 2; ++round) {  // the second round: every key delivered again
    for (const char* key : {"cap-1", "cap-2"}) {
      Reply r = Send(g.port(), "POST", "/charges", R"({"amount":1})", key);
      EXPECT_EQ(r.status, 201) << key << r.body;
      EXPECT_EQ(r.Header("Idempotent-Replayed"), round == 0 ? "" : "true") << key;
    }
    Reply over = Send(g.port(), "POST", "/charges", R"({"amount":1})", "cap-3");
    EXPECT_EQ(over.status, 429) << over.body;
    EXPECT_NE(over.body.find("too-many-keys"), std::string::npos) << over.body;
    EXPECT_EQ(over.Header("Retry-After"), "60");
  }
  // Another principal has keys of its own.
  EXPECT_EQ(Send(g.port(), "POST", "/charges", R"({"amount":1})", "cap-3", "Bearer sk_2").status, 201);
  EXPECT_EQ(upstream_.calls(), 3);
  EXPECT_EQ(upstream_.keys(), (std::vector<std::string>{"cap-1", "cap-2", "cap-3"}));
}

INSTANTIATE_TEST_SUITE_P(Stores, GatewayTest, ::testing::Values("sqlite", "postgres"));

TEST(GatewayOptions, SetUpMistakesAreRefusedNamingTheField) {
  TempDir dir;
  auto s = OpenStore("sqlite:" + dir.File("g.db"));
  ASSERT_TRUE(s.ok());
  Claims claims(*(*s)->claim_store());
  idem::httplib::Gateway::Options o{.upstream = "http://127.0.0.1:9", .claims = &claims};
  o.lease_ms = 1000;
  auto g = idem::httplib::Gateway::Open(o);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("lease_ms"), std::string::npos) << g.status();
  o = {.upstream = "ftp://x", .claims = &claims};
  EXPECT_FALSE(idem::httplib::Gateway::Open(o).ok());
  o = {.upstream = "http://127.0.0.1:9", .claims = nullptr};
  EXPECT_FALSE(idem::httplib::Gateway::Open(o).ok());
  o = {.upstream = "http://127.0.0.1:9", .claims = &claims};
  o.max_keys_per_principal = -1;
  g = idem::httplib::Gateway::Open(o);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("max_keys_per_principal"), std::string::npos) << g.status();
}

// Behind a load balancer that starts each connection with a PROXY header
// (127.0.0.2, trusted): the client it names is the one the per-client bound
// counts and the one the upstream's X-Forwarded-For gets; a PROXY header
// from an address not trusted closes the connection, in the metrics.
TEST(GatewayTrustedProxy, TheClientAProxyHeaderNamesIsCountedAndForwarded) {
  LoopbackServer echo;  // answers the X-Forwarded-For it got
  echo.server().Post(".*", [](const ::httplib::Request& req, ::httplib::Response& res) {
    res.status = 201;
    res.set_content(req.get_header_value("X-Forwarded-For"), "text/plain");
  });
  echo.Start();
  TempDir dir;
  idem::httplib::Gateway::Options o{.upstream = echo.url()};
  o.max_connections_per_client = 1;
  o.trusted_proxies = {"127.0.0.2"};
  o.proxy_protocol = true;
  InProcess g("sqlite:" + dir.File("g.db"), o);
  auto charge = [](const std::string& client, const std::string& key, bool whole) {
    const std::string head = "PROXY TCP4 " + client + " 127.0.0.1 40000 80\r\nPOST /charges HTTP/1.1\r\nHost: x\r\n" +
                             "Authorization: Bearer sk_1\r\nIdempotency-Key: \"" + key +
                             "\"\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n";
    return whole ? head + "{}" : head;
  };
  const std::string first = AnswerFrom("127.0.0.2", g.port(), charge("203.0.113.7", "k-1", true));
  EXPECT_EQ(first.rfind("HTTP/1.1 201 ", 0), 0u) << first;
  EXPECT_NE(first.find("\r\n\r\n203.0.113.7"), std::string::npos) << first;
  const int held = SendFrom("127.0.0.2", g.port(), charge("203.0.113.7", "k-2", false));  // its body never comes
  ASSERT_GE(held, 0);
  std::string over;
  while ((over = AnswerFrom("127.0.0.2", g.port(), charge("203.0.113.7", "k-3", true))).rfind("HTTP/1.1 503 ", 0) != 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // until the held one is counted
  const std::string other = AnswerFrom("127.0.0.2", g.port(), charge("198.51.100.9", "k-4", true));
  EXPECT_EQ(other.rfind("HTTP/1.1 201 ", 0), 0u) << other;
  EXPECT_NE(other.find("\r\n\r\n198.51.100.9"), std::string::npos) << other;
  EXPECT_EQ(AnswerFrom("127.0.0.3", g.port(), charge("198.51.100.10", "k-5", true)), "");
  EXPECT_EQ(g.gateway().server().counters().proxy_refused, 1);
  EXPECT_NE(g.gateway().Metrics().find("\nidem_http_proxy_refused_total 1\n"), std::string::npos);
  ::close(held);

  TempDir other_dir;
  auto s = OpenStore("sqlite:" + other_dir.File("g.db"));
  ASSERT_TRUE(s.ok());
  Claims claims(*(*s)->claim_store());
  o.claims = &claims;
  o.trusted_proxies = {"10.0.0.0/33"};
  auto bad = idem::httplib::Gateway::Open(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("trusted_proxies: '10.0.0.0/33'"), std::string::npos) << bad.status();
}

// ---- Waiting instead of 409 (Options::wait_ms).

// Runs `send` on a thread of its own; done() once it returned.
class Sent {
 public:
  explicit Sent(std::function<Reply()> send)
      : thread_([this, send = std::move(send)] {
          Reply r = send();
          std::lock_guard lock(mu_);
          reply_ = std::move(r);
          done_ = true;
        }) {}
  ~Sent() {
    if (thread_.joinable()) thread_.join();
  }
  bool done() {
    std::lock_guard lock(mu_);
    return done_;
  }
  Reply Get() {
    thread_.join();
    return reply_;
  }

 private:
  std::mutex mu_;
  bool done_ = false;
  Reply reply_;
  std::thread thread_;
};

template <typename Pred>
void Until(Pred pred) {
  while (!pred()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

TEST_P(GatewayTest, WithWaitARepeatWhileTheFirstIsAtTheUpstreamWaitsAndGetsTheReplay) {
  auto o = Options();
  o.wait_ms = 20'000;  // under Send's 30 s read timeout
  InProcess g(StoreUrl(GetParam(), dir_), o);
  Sent first([&] { return Send(g.port(), "POST", "/slow", R"({"a":1})", "wait-1"); });
  Until([&] { return upstream_.calls() == 1; });  // the first is at the upstream
  Sent repeat([&] { return Send(g.port(), "POST", "/slow", R"({"a":1})", "wait-1"); });
  // Until the repeat waits (without the option it is answered 409 at once).
  Until([&] { return g.gateway().counters().waiting == 1 || repeat.done(); });
  upstream_.Release();
  Reply a = first.Get(), b = repeat.Get();
  EXPECT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(b.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(b.body, a.body);
  EXPECT_EQ(upstream_.calls(), 1);
  const auto c = g.gateway().counters();
  EXPECT_EQ(c.in_progress, 0u);
  EXPECT_EQ(c.replayed, 1u);
  EXPECT_EQ(c.waiting, 0u);
}

TEST_P(GatewayTest, WithWaitARepeatGets409WithRetryAfterOnceTheBoundPasses) {
  auto o = Options();
  o.wait_ms = 150;
  InProcess g(StoreUrl(GetParam(), dir_), o);
  Sent first([&] { return Send(g.port(), "POST", "/slow", R"({"a":1})", "wait-2"); });
  Until([&] { return upstream_.calls() == 1; });
  Reply repeat = Send(g.port(), "POST", "/slow", R"({"a":1})", "wait-2");
  EXPECT_EQ(repeat.status, 409) << repeat.body;
  EXPECT_NE(repeat.body.find("request-in-progress"), std::string::npos) << repeat.body;
  EXPECT_FALSE(repeat.Header("Retry-After").empty());
  upstream_.Release();
  EXPECT_EQ(first.Get().status, 200);
  EXPECT_EQ(upstream_.calls(), 1);
  EXPECT_EQ(g.gateway().counters().waiting, 0u);
  EXPECT_EQ(g.gateway().counters().in_progress, 1u);
}

// How many waiters the key records of the PostgreSQL store at `url` count:
// each is a connection held open to LISTEN for the key's completion (the
// store's watch).
int StoreWatchers(const std::string& url) {
  PGconn* c = PQconnectdb(url.c_str());
  int n = -1;
  if (PQstatus(c) == CONNECTION_OK) {
    PGresult* r = PQexec(c, "SELECT coalesce(sum(waiters), 0) FROM idem_claims");
    if (PQresultStatus(r) == PGRES_TUPLES_OK) n = std::atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
  }
  PQfinish(c);
  return n;
}

TEST(GatewayWait, WaitingRepeatsHoldNoStoreConnectionOnPostgres) {
  Upstream upstream;
  idem::httplib::Gateway::Options o;
  o.upstream = upstream.url();
  o.wait_ms = 20'000;
  const std::string url = FreshSchemaUrl();
  InProcess g(url, o);
  Sent first([&] { return Send(g.port(), "POST", "/slow", R"({"a":1})", "wait-3"); });
  Until([&] { return upstream.calls() == 1; });
  constexpr int kRepeats = 5;
  std::vector<std::unique_ptr<Sent>> repeats;
  for (int i = 0; i < kRepeats; ++i)
    repeats.push_back(std::make_unique<Sent>([&] { return Send(g.port(), "POST", "/slow", R"({"a":1})", "wait-3"); }));
  // Until every repeat waits (or one registered the store's watch instead).
  Until([&] { return g.gateway().counters().waiting == kRepeats || StoreWatchers(url) != 0; });
  EXPECT_EQ(StoreWatchers(url), 0) << "a waiting repeat holds a connection that LISTENs";
  upstream.Release();
  const Reply a = first.Get();
  for (auto& r : repeats) {
    const Reply b = r->Get();
    EXPECT_EQ(b.status, a.status) << b.body;
    EXPECT_EQ(b.Header("Idempotent-Replayed"), "true");
  }
  EXPECT_EQ(upstream.calls(), 1);
}

TEST(GatewayOptions, WaitAndPurgeBoundsAreChecked) {
  TempDir dir;
  auto s = OpenStore("sqlite:" + dir.File("g.db"));
  ASSERT_TRUE(s.ok());
  Claims claims(*(*s)->claim_store());
  idem::httplib::Gateway::Options o{.upstream = "http://127.0.0.1:9", .claims = &claims};
  o.wait_ms = -1;
  auto g = idem::httplib::Gateway::Open(o);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("wait_ms"), std::string::npos) << g.status();
  o.wait_ms = 0;
  o.wait_poll_ms = 0;
  EXPECT_FALSE(idem::httplib::Gateway::Open(o).ok());
  o.wait_poll_ms = 50;
  o.purge_every_ms = -1;
  EXPECT_FALSE(idem::httplib::Gateway::Open(o).ok());
}

// ---- Retention and purge (Claims' retention_ms, Options::purge_every_ms).

class GatewayRetention : public ::testing::Test {
 protected:
  static constexpr int64_t kRetentionMs = 60'000;
  // A gateway on SQLite whose records and retention run on env_'s clock.
  std::unique_ptr<InProcess> Start(idem::httplib::Gateway::Options o) {
    auto store = sqlite::Store::Open({.path = dir_.File("gateway.db"), .env = &env_});
    EXPECT_TRUE(store.ok()) << store.status();
    auto claims = Claims::Open(*(*store)->claim_store(), {.retention_ms = kRetentionMs, .env = &env_});
    EXPECT_TRUE(claims.ok()) << claims.status();
    o.upstream = upstream_.url();
    return std::make_unique<InProcess>(std::move(*store), std::move(*claims), o);
  }
  size_t Records(InProcess& g) {
    auto all = g.store().claim_store()->ListClaims("", 100);
    EXPECT_TRUE(all.ok()) << all.status();
    return all.ok() ? all->size() : 0;
  }
  TempDir dir_;
  FakeEnv env_;
  Upstream upstream_;
};

TEST_F(GatewayRetention, AnExpiredKeyIsPurgedAndForwardedAgainWhileAnUnexpiredOneIsReplayed) {
  auto g = Start({});
  ASSERT_EQ(Send(g->port(), "POST", "/charges", R"({"a":1})", "old").status, 201);
  env_.Advance(kRetentionMs * 2 / 3);
  ASSERT_EQ(Send(g->port(), "POST", "/charges", R"({"a":1})", "new").status, 201);
  env_.Advance(kRetentionMs / 2);  // "old" is past its retention, "new" is not
  EXPECT_EQ(Records(*g), 2u);
  auto purged = g->gateway().PurgeExpired();
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 1);
  EXPECT_EQ(Records(*g), 1u);
  EXPECT_EQ(g->gateway().counters().purged, 1u);
  EXPECT_NE(g->gateway().Metrics().find("idem_gateway_purged_total 1\n"), std::string::npos);
  Reply old = Send(g->port(), "POST", "/charges", R"({"a":1})", "old");
  EXPECT_EQ(old.status, 201);
  EXPECT_EQ(old.Header("Idempotent-Replayed"), "") << "a purged key is new again";
  Reply kept = Send(g->port(), "POST", "/charges", R"({"a":1})", "new");
  EXPECT_EQ(kept.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(upstream_.calls(), 3);
}

TEST_F(GatewayRetention, TheTimerPurgesExpiredKeys) {
  idem::httplib::Gateway::Options o;
  o.purge_every_ms = 20;
  auto g = Start(o);
  ASSERT_EQ(Send(g->port(), "POST", "/charges", R"({"a":1})", "old").status, 201);
  env_.Advance(kRetentionMs + 1);
  Until([&] { return g->gateway().counters().purged == 1; });
  EXPECT_EQ(Records(*g), 0u);
  EXPECT_EQ(g->gateway().counters().purge_errors, 0u);
}

// ---- Request-latency histograms by outcome: the gateway's, the
// middleware's (MountMetrics), `idem provider`'s: one piece (src/http/latency.h).

// The histogram `name` in a scrape: each outcome's _count, after checking
// that its buckets only grow, that +Inf is the count, and that the sum is
// there.
std::map<std::string, uint64_t> HistogramCounts(const std::string& text, const std::string& name) {
  std::map<std::string, uint64_t> counts;
  std::map<std::string, uint64_t> last_bucket;
  std::map<std::string, int> buckets, sums;
  const std::regex line("^" + name + "_(bucket|sum|count)\\{outcome=\"([a-z_]+)\"(,le=\"([^\"]+)\")?\\} ([0-9.]+)$");
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (!std::regex_match(l, m, line)) continue;
    const std::string kind = m[1], outcome = m[2];
    if (kind == "bucket") {
      const uint64_t v = std::stoull(m[5]);
      EXPECT_GE(v, last_bucket[outcome]) << l;
      last_bucket[outcome] = v;
      ++buckets[outcome];
    } else if (kind == "sum") {
      ++sums[outcome];
    } else {
      counts[outcome] = std::stoull(m[5]);
      EXPECT_EQ(last_bucket[outcome], counts[outcome]) << "+Inf is the count: " << l;
    }
  }
  for (const auto& [outcome, n] : counts) {
    EXPECT_EQ(buckets[outcome], 15) << outcome;  // 14 bounds and +Inf
    EXPECT_EQ(sums[outcome], 1) << outcome;
  }
  EXPECT_NE(text.find("# TYPE " + name + " histogram\n"), std::string::npos) << text;
  return counts;
}

uint64_t Total(const std::map<std::string, uint64_t>& counts) {
  uint64_t n = 0;
  for (const auto& [outcome, c] : counts) n += c;
  return n;
}

TEST_P(GatewayTest, TheLatencyHistogramsCountEveryRequestOnceByOutcome) {
  auto o = Options();
  o.paths = {"/charges"};
  InProcess g(StoreUrl(GetParam(), dir_), o);
  Send(g.port(), "POST", "/charges", R"({"a":1})", "h-1");  // forwarded
  Send(g.port(), "POST", "/charges", R"({"a":1})", "h-1");  // replayed
  Send(g.port(), "POST", "/charges", R"({"a":1})", "h-1");  // replayed
  Send(g.port(), "POST", "/charges", R"({"a":2})", "h-1");  // conflict
  Send(g.port(), "POST", "/charges", R"({"a":1})", "");     // refused
  Send(g.port(), "POST", "/other", R"({"a":1})", "h-1");    // passed
  const auto counts = HistogramCounts(Send(g.port(), "GET", "/metrics", "", "").body, "idem_gateway_request_seconds");
  EXPECT_EQ(counts.at("forwarded"), 1u);
  EXPECT_EQ(counts.at("replayed"), 2u);
  EXPECT_EQ(counts.at("conflict"), 1u);
  EXPECT_EQ(counts.at("refused"), 1u);
  EXPECT_EQ(counts.at("passed"), 1u);
  EXPECT_EQ(counts.size(), 8u);  // every outcome has its series, zeros too
  EXPECT_EQ(Total(counts), 6u);
}

TEST(RequestLatency, TheMiddlewaresMetricsRouteHasTheHistogramByOutcome) {
  TempDir dir;
  auto s = OpenStore("sqlite:" + dir.File("m.db"));
  ASSERT_TRUE(s.ok()) << s.status();
  Claims claims(*(*s)->claim_store());
  auto idempotency =
      http::Idempotency::Open({.claims = &claims, .authenticate = http::BearerKeys({{"sk_1", "acct_1"}})});
  ASSERT_TRUE(idempotency.ok()) << idempotency.status();
  LoopbackServer server;
  auto charge =
      idem::httplib::Wrap(**idempotency, "/charges", {}, [](const ::httplib::Request&, ::httplib::Response& res) {
        res.status = 201;
        res.set_content("{\"id\":\"ch_1\"}", "application/json");
      });
  ASSERT_TRUE(charge.ok()) << charge.status();
  server.server().Post("/charges", *charge);
  Metrics metrics;
  idem::httplib::MountMetrics(server.server(), **idempotency, &metrics);
  server.Start();
  const int port = server.port();
  Send(port, "POST", "/charges", R"({"a":1})", "m-1");                   // executed
  Send(port, "POST", "/charges", R"({"a":1})", "m-1");                   // replayed
  Send(port, "POST", "/charges", R"({"a":2})", "m-1");                   // conflict
  Send(port, "POST", "/charges", R"({"a":1})", "");                      // rejected: no key
  Send(port, "POST", "/charges", R"({"a":1})", "m-2", "Bearer nobody");  // rejected: 401
  const std::string text = Send(port, "GET", "/metrics", "", "").body;
  const auto counts = HistogramCounts(text, "idem_http_request_seconds");
  EXPECT_EQ(counts.at("executed"), 1u);
  EXPECT_EQ(counts.at("replayed"), 1u);
  EXPECT_EQ(counts.at("conflict"), 1u);
  EXPECT_EQ(counts.at("rejected"), 2u);
  EXPECT_EQ(Total(counts), 5u);
  EXPECT_NE(text.find("idem_http_executed_total 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("idem_http_replayed_total 1\n"), std::string::npos) << text;
}

TEST(RequestLatency, IdemProvidersMetricsHaveTheHistogramByOutcome) {
  TempDir dir;
  int port = 0;
  pid_t pid = SpawnServing(
      [&](int listen) -> std::vector<std::string> {
        return {IDEM_CLI,    "provider",
                "--api-key", "sk_1:acct_1",
                "--listen",  "127.0.0.1:" + std::to_string(listen),
                "--store",   "sqlite:" + dir.File("p.db"),
                "--quiet"};
      },
      "", port);
  ASSERT_GT(pid, 0);
  const std::string body = R"({"amount": 4000, "currency": "usd", "customer": "cus_1"})";
  Reply first = Send(port, "POST", "/charges", body, "p-1");
  Reply again = Send(port, "POST", "/charges", body, "p-1");
  Send(port, "POST", "/charges", body, "");
  const std::string text = Send(port, "GET", "/metrics", "", "").body;
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_EQ(first.status, 201) << first.body;
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  const auto counts = HistogramCounts(text, "idem_http_request_seconds");
  EXPECT_EQ(counts.at("executed"), 1u) << text;
  EXPECT_EQ(counts.at("replayed"), 1u);
  EXPECT_EQ(counts.at("rejected"), 1u);
  EXPECT_EQ(Total(counts), 3u);
  EXPECT_NE(text.find("idem_http_executed_total 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("idem_http_connections_open"), std::string::npos) << text;
}

// ---- Guarded forwards on keep-alive connections.

// Guarded requests one after another, from one keep-alive client, come in
// on one connection (the gateway's server does not close it every fifth
// request, as cpp-httplib's default would) and reuse the upstream's
// keep-alive connection (they used to open one each).
TEST(GatewayKeepAlive, GuardedForwardsReuseKeepAliveConnections) {
  TempDir dir;
  LoopbackServer upstream(8);
  std::atomic<int> calls{0};
  upstream.server().Post(".*", [&](const ::httplib::Request&, ::httplib::Response& res) {
    ++calls;
    res.status = 201;
    res.set_content("{}", "application/json");
  });
  upstream.Start();
  idem::httplib::Gateway::Options o;
  o.upstream = upstream.url();
  InProcess g("sqlite:" + dir.File("gateway.db"), o);
  constexpr int kRequests = 20;
  ::httplib::Client client("127.0.0.1", g.port());
  client.set_keep_alive(true);
  for (int i = 0; i < kRequests; ++i) {
    auto r =
        client.Post("/charges", {{"Authorization", "Bearer sk_a"}, {"Idempotency-Key", "reuse-" + std::to_string(i)}},
                    R"({"a":1})", "application/json");
    ASSERT_TRUE(r) << i << ": " << ::httplib::to_string(r.error());
    ASSERT_EQ(r->status, 201) << r->body;
  }
  EXPECT_EQ(calls.load(), kRequests);
  EXPECT_EQ(g.gateway().server().counters().accepted, 1) << "the client's connection was closed under it";
  EXPECT_LE(upstream.counters().accepted, 2) << "a connection per guarded forward";
}

// An upstream that answers HTTP/1.1 (keep-alive, nothing said about closing)
// and then closes each connection: every guarded request sent on a kept
// connection it has closed would look sent with its answer lost. It counts
// its connections and the keys it was sent.
class ClosingUpstream {
 public:
  ClosingUpstream() : fd_(ListenOnLoopback(64, port_)) {
    EXPECT_GE(fd_, 0) << "cannot listen on 127.0.0.1";
    thread_ = std::thread([this] { Serve(); });
  }
  ~ClosingUpstream() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int connections() {
    std::lock_guard lock(mu_);
    return connections_;
  }
  std::vector<std::string> keys() {
    std::lock_guard lock(mu_);
    return keys_;
  }
  // Until every connection that carried a request has been closed.
  void WaitAllClosed() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return closed_ >= connections_; });
  }

 private:
  void Serve() {
    for (;;) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string in;
      char buf[4096];
      size_t head_end = std::string::npos;
      ssize_t n = 0;
      while (head_end == std::string::npos && (n = ::recv(c, buf, sizeof buf, 0)) > 0) {
        in.append(buf, static_cast<size_t>(n));
        head_end = in.find("\r\n\r\n");
      }
      if (head_end != std::string::npos) {
        std::string key;
        size_t length = 0;
        std::string head = in.substr(0, head_end);
        for (char& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        if (size_t at = head.find("\r\nidempotency-key: "); at != std::string::npos)
          key = in.substr(at + 19, in.find("\r\n", at + 2) - at - 19);
        if (size_t at = head.find("\r\ncontent-length: "); at != std::string::npos)
          length = std::stoul(head.substr(at + 18));
        while (in.size() < head_end + 4 + length && (n = ::recv(c, buf, sizeof buf, 0)) > 0)
          in.append(buf, static_cast<size_t>(n));
        {
          std::lock_guard lock(mu_);
          ++connections_;
          keys_.push_back(key);
        }
        const std::string body = "{\"ok\":true}";
        const std::string out =
            "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
            "\r\n\r\n" + body;
        EXPECT_EQ(::send(c, out.data(), out.size(), MSG_NOSIGNAL), static_cast<ssize_t>(out.size()));
      }
      ::close(c);  // without a word: the response said keep-alive
      std::lock_guard lock(mu_);
      ++closed_;
      cv_.notify_all();
    }
  }

  int port_ = 0;  // before fd_: the constructor sets both
  const int fd_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  int connections_ = 0, closed_ = 0;
  std::vector<std::string> keys_;
};

// The gateway checks a kept connection before it sends on it: one the
// upstream closed is replaced by a new connection, so every guarded request
// is forwarded exactly once and none is answered outcome-unknown.
TEST(GatewayKeepAlive, AnUpstreamThatClosesEachConnectionAfterItsAnswerLeavesNoOutcomeUnknown) {
  TempDir dir;
  ClosingUpstream upstream;
  idem::httplib::Gateway::Options o;
  o.upstream = upstream.url();
  InProcess g("sqlite:" + dir.File("gateway.db"), o);
  constexpr int kRequests = 30;
  std::vector<std::string> sent;
  for (int i = 0; i < kRequests; ++i) {
    sent.push_back("closing-" + std::to_string(i));
    Reply r = Send(g.port(), "POST", "/charges", R"({"a":1})", sent.back());
    EXPECT_EQ(r.status, 201) << r.body;
    // The next request only once the upstream has closed this one's
    // connection (else the two would race: the residual race of gateway.md).
    upstream.WaitAllClosed();
  }
  EXPECT_EQ(upstream.keys(), sent) << "each key forwarded exactly once";
  EXPECT_EQ(upstream.connections(), kRequests);
  EXPECT_EQ(g.gateway().counters().outcome_unknown, 0u);
  EXPECT_EQ(g.gateway().counters().upstream_errors, 0u);
  EXPECT_EQ(g.gateway().counters().forwarded, static_cast<uint64_t>(kRequests));
}

}  // namespace
}  // namespace idem::testing
