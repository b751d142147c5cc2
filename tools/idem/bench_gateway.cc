// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem bench gateway: what idem::httplib::Gateway adds to a request, in one
// process and one run. An upstream (an epoll loop on 127.0.0.1 that answers
// POST with 201 and a small JSON body after --upstream-delay-ms) and a
// Gateway in front of it on --store; keep-alive clients (http_load.h: one
// epoll loop, as wrk) send each request either straight to the upstream
// ("direct") or through the gateway, side by side, in rounds that alternate
// which side goes first, so machine noise hits both. The upstream and the
// clients are event loops so that they take as little as they can of the
// cores the gateway runs on (on a machine of its own each would run
// elsewhere):
//   first   a fresh Idempotency-Key per request (through the gateway: a
//           claim, the forward, the stored answer);
//   replay  the keys of this round's first executions again (through the
//           gateway: answered from the store, never forwarded; direct: the
//           upstream answers a key it has seen at once, without its delay,
//           the fastest replay an upstream can give, so gateway - direct is
//           what the gateway adds: a hop and a store read).
// Latency: one client to each side, requests alternating between the sides
// one by one, --latency-requests per mode and round; p50/p99 of every round
// together and the added latency gateway - direct. Throughput:
// --clients clients, --requests per mode and round, the median of the
// per-round ratios gateway/direct, and the requests' latency under that
// load (with closed-loop clients, rate = clients / mean latency: 0.9x of
// direct allows the gateway to add a ninth of direct's mean latency). Checks that every request was answered
// 201, that the upstream saw every gateway first execution once and no
// gateway replay, and the gateway's counters; exit 1 if not.
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "components.h"
#include "http_load.h"
#include "idem/env.h"
#include "idem/httplib/gateway.h"
#include "idem/httplib/server.h"
#include "idem/sqlite/store.h"
#include "idem/url.h"

namespace idem::cli {
namespace {

constexpr const char* kPrincipal = "Bearer sk_bench_gateway";
// Issue 37's targets.
constexpr double kReplayAddedP99Ms = 1.0, kFirstAddedP99Ms = 2.0, kThroughputRatio = 0.9;
constexpr int64_t kWarmupRequests = 200;
const std::vector<std::string> kModes = {"direct_first", "gateway_first", "direct_replay", "gateway_replay"};
// Throughput also has the hop alone: the same first executions through the
// gateway on a path it does not guard (forwarded, no key claimed or stored).
const std::vector<std::string> kThroughputModes = {"direct_first", "gateway_first", "pass_first", "direct_replay",
                                                   "gateway_replay"};
constexpr const char* kGuardedPath = "/charges";
constexpr const char* kPassPath = "/pass/charges";

// The API behind the gateway: one epoll loop on a thread of its own (as an
// asynchronous server answers, so that it takes as little as it can of the
// cores the gateway runs on), each answer sent when its delay has passed (a
// timerfd at the earliest one). A request under /gw came through the gateway
// (under /gw/pass, unguarded); every other came direct. A key seen before is
// answered at once; a new one after the delay.
class Upstream {
 public:
  static Result<std::unique_ptr<Upstream>> Start(int64_t delay_ms) {
    auto up = std::unique_ptr<Upstream>(new Upstream(delay_ms));
    IDEM_RETURN_IF_ERROR(up->Listen());
    up->thread_ = std::thread([raw = up.get()] {
      ::pthread_setname_np(::pthread_self(), "bench-upstream");
      raw->Loop();
    });
    return up;
  }
  ~Upstream() {
    const uint64_t one = 1;
    if (stop_fd_ >= 0) (void)!::write(stop_fd_, &one, sizeof one);
    if (thread_.joinable()) thread_.join();
    for (auto& [fd, c] : conns_) ::close(fd);
    for (int fd : {listen_fd_, timer_fd_, stop_fd_, ep_})
      if (fd >= 0) ::close(fd);
  }
  int port() const { return port_; }
  struct Calls {
    int64_t direct = 0, gateway = 0, gateway_repeats = 0, passed = 0;
  };
  Calls calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }

 private:
  explicit Upstream(int64_t delay_ms) : delay_(std::chrono::milliseconds(delay_ms)) {}
  using Clock = std::chrono::steady_clock;
  struct Conn {
    uint64_t id = 0;  // tells a connection from an earlier one on the same descriptor
    std::string in, out;
    size_t sent = 0;
    bool answering = false;  // a request read, its answer not yet sent
  };
  struct Due {
    Clock::time_point at;
    int fd;
    uint64_t conn_id;
    std::string answer;
    bool operator>(const Due& o) const { return at > o.at; }
  };

  Status Listen() {
    IDEM_ASSIGN_OR_RETURN(listen_fd_, ListenOnLoopback("upstream", SOMAXCONN, port_, /*nonblocking=*/true));
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    stop_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ep_ < 0 || timer_fd_ < 0 || stop_fd_ < 0) return Status::Unavailable("upstream: cannot make its event loop");
    for (int fd : {listen_fd_, timer_fd_, stop_fd_}) Watch(fd, EPOLLIN);
    return Status::OK();
  }

  void Watch(int fd, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    ::epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
  }

  void Loop() {
    epoll_event evs[256];
    for (;;) {
      const int n = ::epoll_wait(ep_, evs, 256, -1);
      for (int i = 0; i < n; ++i) {
        const int fd = evs[i].data.fd;
        if (fd == stop_fd_) return;
        if (fd == listen_fd_) {
          Accept();
        } else if (fd == timer_fd_) {
          uint64_t expirations;
          (void)!::read(timer_fd_, &expirations, sizeof expirations);
        } else if (auto it = conns_.find(fd); it != conns_.end()) {
          if (evs[i].events & EPOLLOUT) Flush(fd, it->second);
          it = conns_.find(fd);  // Flush may have closed it
          if (it != conns_.end() && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) Read(fd, it->second);
        }
      }
      SendDue();
    }
  }

  void Accept() {
    for (int fd; (fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
      const int yes = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
      conns_[fd].id = ++conn_ids_;
      Watch(fd, EPOLLIN | EPOLLOUT | EPOLLET);
    }
  }

  void Close(int fd) {
    conns_.erase(fd);
    ::close(fd);
  }

  void Read(int fd, Conn& c) {
    if (!ReadAvailable(fd, c.in)) return Close(fd);
    Serve(fd, c);
  }

  // Answers the request at the head of `c.in` once it is complete and the
  // last answer on `c` is sent (one at a time, in order).
  void Serve(int fd, Conn& c) {
    if (c.answering) return;
    auto head = ParseHttpHead(c.in);
    if (!head) return;
    const size_t total = head->head_size + static_cast<size_t>(head->content_length);
    if (c.in.size() < total) return;
    const std::string_view sl = head->start_line;
    const size_t sp1 = sl.find(' '), sp2 = sl.find(' ', sp1 + 1);
    const std::string_view method = sl.substr(0, sp1), path = sl.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string key(HttpHeaderValue(*head, "Idempotency-Key"));
    const bool close = head->close;
    std::string answer;
    bool fresh = false;
    if (method != "POST") {
      answer = std::string("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n") + (close ? "Connection: close\r\n" : "") +
               "\r\n";
    } else {
      const bool passed = path.rfind("/gw/pass/", 0) == 0;
      const bool via_gateway = !passed && path.rfind("/gw/", 0) == 0;
      {
        std::lock_guard lock(mu_);
        fresh = seen_.insert(key).second;
        ++(passed ? calls_.passed : via_gateway ? calls_.gateway : calls_.direct);
        if (via_gateway && !fresh) ++calls_.gateway_repeats;
      }
      const std::string body = R"({"id":"ch_)" + std::to_string(std::hash<std::string>{}(key) % 1000000) +
                               R"(","object":"charge","amount":4000,"currency":"usd","status":"succeeded"})";
      answer =
          "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\n" + (close ? "Connection: close\r\n" : "") + "\r\n" + body;
    }
    c.in.erase(0, total);
    c.answering = true;
    if (fresh && delay_.count() > 0) {
      due_.push({Clock::now() + delay_, fd, c.id, std::move(answer)});
      if (due_.top().fd == fd) Arm();
      return;
    }
    Answer(fd, c, std::move(answer));
  }

  void Answer(int fd, Conn& c, std::string answer) {
    c.out += answer;
    Flush(fd, c);
  }

  void Flush(int fd, Conn& c) {
    if (!WritePending(fd, c.out, c.sent)) return Close(fd);
    if (c.sent < c.out.size() || !c.answering) return;
    c.out.clear();
    c.sent = 0;
    c.answering = false;
    Serve(fd, c);  // a request that came in meanwhile
  }

  // Sends every answer whose delay has passed; arms the timer for the next.
  void SendDue() {
    const auto now = Clock::now();
    while (!due_.empty() && due_.top().at <= now) {
      Due d = due_.top();
      due_.pop();
      if (auto it = conns_.find(d.fd); it != conns_.end() && it->second.id == d.conn_id)
        Answer(d.fd, it->second, std::move(d.answer));
    }
    if (!due_.empty()) Arm();
  }

  void Arm() {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(due_.top().at.time_since_epoch()).count();
    itimerspec t{};
    t.it_value.tv_sec = ns / 1'000'000'000;
    t.it_value.tv_nsec = ns % 1'000'000'000;
    ::timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &t, nullptr);
  }

  const Clock::duration delay_;
  int listen_fd_ = -1, ep_ = -1, timer_fd_ = -1, stop_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::unordered_map<int, Conn> conns_;  // the loop's
  uint64_t conn_ids_ = 0;
  std::priority_queue<Due, std::vector<Due>, std::greater<>> due_;
  std::mutex mu_;
  std::unordered_set<std::string> seen_;  // guarded by mu_
  Calls calls_;                           // guarded by mu_
};

// The gateway and its store, served on a thread of its own.
class InProcessGateway {
 public:
  static Result<std::unique_ptr<InProcessGateway>> Start(const std::string& store_url, int upstream_port, int threads) {
    auto g = std::unique_ptr<InProcessGateway>(new InProcessGateway);
    IDEM_ASSIGN_OR_RETURN(g->opened_, OpenClaimStore(store_url));
    IDEM_ASSIGN_OR_RETURN(g->claims_, Claims::Open(*g->opened_.claims));
    httplib::Gateway::Options o;
    o.upstream = "http://127.0.0.1:" + std::to_string(upstream_port) + "/gw";
    o.claims = g->claims_.get();
    o.paths = {kGuardedPath};
    o.threads = threads;
    o.max_connections = 4096;
    o.max_connections_per_client = 0;  // every client is 127.0.0.1
    IDEM_ASSIGN_OR_RETURN(g->gateway_, httplib::Gateway::Open(o));
    g->thread_ = std::thread([raw = g.get()] { (void)raw->gateway_->Run(); });
    while (!g->gateway_->server().native().is_running()) std::this_thread::yield();
    return g;
  }
  ~InProcessGateway() {
    if (gateway_) gateway_->Stop();
    if (thread_.joinable()) thread_.join();
  }
  httplib::Gateway& gateway() { return *gateway_; }
  const OpenedClaims& store() const { return opened_; }

 private:
  InProcessGateway() = default;
  OpenedClaims opened_;
  std::unique_ptr<Claims> claims_;
  std::unique_ptr<httplib::Gateway> gateway_;
  std::thread thread_;
};

struct Settings {
  std::string store_url;  // empty: a SQLite file in a temporary directory
  int64_t clients = 64, delay_ms = 5, requests = 2000, latency_requests = 300, rounds = 3;
  bool json = false;
};

Result<Settings> ParseSettings(const Args& args) {
  Settings st;
  if (args.Has("store")) st.store_url = args.Get("store");
  auto clients = args.Has("clients") ? args.GetInt("clients", 1, 1024) : Result<int64_t>(st.clients);
  auto delay = args.Has("upstream-delay-ms") ? args.GetInt("upstream-delay-ms", 0, 60'000) : Result<int64_t>(5);
  auto requests = args.Has("requests") ? args.GetInt("requests", 1, 10'000'000) : Result<int64_t>(st.requests);
  auto latency = args.Has("latency-requests") ? args.GetInt("latency-requests", 1, 10'000'000)
                                              : Result<int64_t>(st.latency_requests);
  auto rounds = args.Has("rounds") ? args.GetInt("rounds", 1, 1000) : Result<int64_t>(st.rounds);
  for (const auto* r : {&clients, &delay, &requests, &latency, &rounds}) IDEM_RETURN_IF_ERROR(r->status());
  st.clients = *clients, st.delay_ms = *delay, st.requests = *requests, st.latency_requests = *latency;
  st.rounds = *rounds;
  if (!st.store_url.empty() && UrlScheme(st.store_url) != "sqlite" && !IsPostgresScheme(st.store_url))
    return Status::InvalidArgument("--store must be sqlite:PATH or postgres://..., not '" + RedactUrl(st.store_url) +
                                   "'");
  st.json = args.Bool("json");
  return st;
}

std::vector<HttpPost> Posts(const std::string& prefix, int64_t n) {
  std::vector<HttpPost> posts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    HttpPost& p = posts[static_cast<size_t>(i)];
    p.body = R"({"amount":4000,"currency":"usd","customer":"cus_)" + std::to_string(i % 100) + R"("})";
    p.headers = {{"Authorization", kPrincipal}, {"Idempotency-Key", prefix + std::to_string(i)}};
  }
  return posts;
}

// What the rounds measured, per mode.
struct Figures {
  std::map<std::string, std::vector<double>> latency_ms;  // one client, every round
  std::map<std::string, std::vector<double>> per_s;       // --clients, one rate per round
  // --clients, per round: the CPU time per request of this process (the
  // clients, the upstream and the gateway) and of the whole machine (also a
  // PostgreSQL store's server), in microseconds, and the machine's busy cores.
  std::map<std::string, std::vector<double>> process_cpu_us, machine_cpu_us, machine_busy_cores, switches;
  // --clients, per round: the requests' time under that load, in ms.
  std::map<std::string, std::vector<double>> loaded_mean_ms, loaded_p50_ms, loaded_p99_ms;
  std::map<std::string, int64_t> sent;  // requests, warm-up included
  int64_t unexpected = 0;
};

// Latency: one keep-alive client to each side, the requests alternating
// between them one by one (which side goes first alternating too), so that
// machine noise falls on both alike. Appends each request's time, in ms, to
// `direct_ms` and `gateway_ms` when given.
void Alternate(int upstream_port, int gateway_port, const std::vector<HttpPost>& direct,
               const std::vector<HttpPost>& gateway, std::vector<double>* direct_ms, std::vector<double>* gateway_ms,
               int64_t& unexpected) {
  ::httplib::Client d("127.0.0.1", upstream_port), g("127.0.0.1", gateway_port);
  for (::httplib::Client* c : {&d, &g}) {
    c->set_keep_alive(true);
    c->set_tcp_nodelay(true);
    c->set_read_timeout(60, 0);
    (void)c->Get("/connect");  // connected before the clock starts (404)
  }
  const auto one = [&](::httplib::Client& c, const HttpPost& p, std::vector<double>* ms) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.Post(kGuardedPath, p.headers, p.body, "application/json");
    if (ms != nullptr)
      ms->push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if ((!r || r->status != 201) && unexpected++ == 0)
      std::fprintf(stderr, "idem bench gateway: /charges answered %s\n",
                   r ? (std::to_string(r->status) + " " + r->body).c_str() : ::httplib::to_string(r.error()).c_str());
  };
  for (size_t i = 0; i < direct.size(); ++i) {
    if (i % 2 == 0) one(d, direct[i], direct_ms);
    one(g, gateway[i], gateway_ms);
    if (i % 2 == 1) one(d, direct[i], direct_ms);
  }
}

// One phase of one round: first executions of both sides, then their
// replays; with --clients, the side going first alternating with `round`,
// and first executions also through the gateway unguarded (the hop alone),
// the three sides in turn.
void Phase(const Settings& st, int upstream_port, int gateway_port, const std::string& prefix, int64_t round,
           bool latency, Figures& f) {
  const int64_t n = round == 0 ? std::min(kWarmupRequests, latency ? st.latency_requests : st.requests)
                    : latency  ? st.latency_requests
                               : st.requests;
  const std::string tag = prefix + std::to_string(round) + (latency ? "l-" : "t-");
  const std::map<std::string, std::vector<HttpPost>> posts = {
      {"direct", Posts(tag + "d-", n)}, {"gateway", Posts(tag + "g-", n)}, {"pass", Posts(tag + "p-", n)}};
  for (const std::string kind : {"first", "replay"}) {
    f.sent["direct_" + kind] += n;
    f.sent["gateway_" + kind] += n;
    if (latency) {
      const bool keep = round > 0;
      Alternate(upstream_port, gateway_port, posts.at("direct"), posts.at("gateway"),
                keep ? &f.latency_ms["direct_" + kind] : nullptr, keep ? &f.latency_ms["gateway_" + kind] : nullptr,
                f.unexpected);
      continue;
    }
    const std::vector<std::string> sides = kind == "first" ? std::vector<std::string>{"direct", "gateway", "pass"}
                                                           : std::vector<std::string>{"direct", "gateway"};
    if (kind == "first") f.sent["pass_first"] += n;
    for (size_t k = 0; k < sides.size(); ++k) {
      const std::string& side = sides[(static_cast<size_t>(round) + k) % sides.size()];
      const PostedAll r =
          PostAll(side == "direct" ? upstream_port : gateway_port, side == "pass" ? kPassPath : kGuardedPath,
                  posts.at(side), static_cast<int>(st.clients), 201, "bench gateway");
      f.unexpected += r.unexpected;
      if (round == 0) continue;
      const std::string mode = side + "_" + kind;
      f.per_s[mode].push_back(r.seconds > 0 ? static_cast<double>(n) / r.seconds : 0);
      f.process_cpu_us[mode].push_back(r.process_cpu_seconds * 1e6 / static_cast<double>(n));
      f.machine_cpu_us[mode].push_back(r.machine_cpu_seconds * 1e6 / static_cast<double>(n));
      f.machine_busy_cores[mode].push_back(r.seconds > 0 ? r.machine_cpu_seconds / r.seconds : 0);
      f.switches[mode].push_back(static_cast<double>(r.context_switches) / static_cast<double>(n));
      double sum = 0;
      for (double ms : r.latencies_ms) sum += ms;
      f.loaded_mean_ms[mode].push_back(r.latencies_ms.empty() ? 0 : sum / static_cast<double>(r.latencies_ms.size()));
      f.loaded_p50_ms[mode].push_back(PercentileOfSorted(r.latencies_ms, 0.5));
      f.loaded_p99_ms[mode].push_back(PercentileOfSorted(r.latencies_ms, 0.99));
    }
  }
}

// Round by round, the rate of mode `a` over that of mode `b`.
std::vector<double> Ratios(const Figures& f, const std::string& a, const std::string& b) {
  std::vector<double> out;
  const auto& x = f.per_s.at(a);
  const auto& y = f.per_s.at(b);
  for (size_t i = 0; i < y.size(); ++i) out.push_back(y[i] > 0 ? x[i] / y[i] : 0);
  return out;
}

nlohmann::json Target(double value, double target, bool at_most) {
  return {{"value", value}, {"target", target}, {"met", at_most ? value <= target : value >= target}};
}

void PrintText(const nlohmann::json& j) {
  std::printf("idem bench gateway: store %s (%s), upstream %lld ms, %lld rounds\n",
              j["store"].get<std::string>().c_str(), j["durability"].get<std::string>().c_str(),
              static_cast<long long>(j["upstream_delay_ms"].get<int64_t>()),
              static_cast<long long>(j["rounds"].get<int64_t>()));
  if (j.contains("fsync_per_s"))
    std::printf("disk: %lld fdatasync/s (a first execution through the gateway commits twice)\n",
                static_cast<long long>(j["fsync_per_s"].get<int64_t>()));
  const auto& lat = j["latency"];
  std::printf("latency, 1 client, %lld requests per mode:\n",
              static_cast<long long>(lat["direct_first"]["requests"].get<int64_t>()));
  for (const std::string& m : kModes)
    std::printf("  %-15s p50 %7.3f ms  p99 %7.3f ms\n", m.c_str(), lat[m]["p50_ms"].get<double>(),
                lat[m]["p99_ms"].get<double>());
  for (const std::string kind : {"first", "replay"})
    std::printf("  added (gateway - direct), %-6s p50 %+7.3f ms  p99 %+7.3f ms\n", kind.c_str(),
                lat["added_" + kind]["p50_ms"].get<double>(), lat["added_" + kind]["p99_ms"].get<double>());
  const auto& tp = j["throughput"];
  std::printf("throughput, %lld clients, median of rounds:\n", static_cast<long long>(j["clients"].get<int64_t>()));
  for (const std::string& m : kThroughputModes)
    std::printf(
        "  %-15s %9.0f/s   per request: CPU %4.0f us (this process), %4.0f us (machine), %4.1f thread switches; %.2f "
        "cores busy\n",
        m.c_str(), tp[m]["median_per_s"].get<double>(), tp[m]["process_cpu_us"].get<double>(),
        tp[m]["machine_cpu_us"].get<double>(), tp[m]["context_switches"].get<double>(),
        tp[m]["machine_busy_cores"].get<double>());
  std::printf("latency under that load (median of rounds):\n");
  for (const std::string& m : kThroughputModes)
    std::printf("  %-15s mean %7.3f ms  p50 %7.3f ms  p99 %7.3f ms\n", m.c_str(), tp[m]["loaded_mean_ms"].get<double>(),
                tp[m]["loaded_p50_ms"].get<double>(), tp[m]["loaded_p99_ms"].get<double>());
  for (const std::string kind : {"first", "replay"})
    std::printf("  gateway/direct, %-6s %.3f (rounds %s)\n", kind.c_str(), tp["ratio_" + kind].get<double>(),
                tp["ratio_" + kind + "_rounds"].dump().c_str());
  std::printf("  the hop alone: pass/direct, first %.3f (rounds %s)\n", tp["ratio_pass"].get<double>(),
              tp["ratio_pass_rounds"].dump().c_str());
  std::printf("  the store's part: gateway/pass, first %.3f (rounds %s)\n", tp["ratio_first_to_pass"].get<double>(),
              tp["ratio_first_to_pass_rounds"].dump().c_str());
  const auto& t = j["targets"];
  auto line = [](const char* what, const nlohmann::json& x, const char* unit) {
    std::printf("  %-44s %.3f%s (target %s %.1f%s): %s\n", what, x["value"].get<double>(), unit,
                std::string(what).find("throughput") != std::string::npos ? ">=" : "<=", x["target"].get<double>(),
                unit, x["met"].get<bool>() ? "met" : "NOT met");
  };
  std::printf("targets (issue 37):\n");
  line("p99 added, replays", t["replay_added_p99_ms"], " ms");
  line("p99 added, first executions", t["first_added_p99_ms"], " ms");
  line("throughput gateway/direct, first executions", t["throughput_ratio_first"], "x");
  const auto& c = j["checks"];
  std::printf("checks: %s\n", c.dump().c_str());
}

}  // namespace

int RunBenchGateway(const Args& args) {
  const std::string cmd = "bench gateway";
  auto settings = ParseSettings(args);
  if (!settings.ok()) return Fail(cmd, settings.status());
  Settings st = *settings;
  std::optional<ScratchDir> tmp;  // the default store's
  if (st.store_url.empty()) {
    auto dir = ScratchDir::Make("idem-bench-gateway");
    if (!dir.ok()) return Fail(cmd, dir.status());
    tmp.emplace(std::move(*dir));
    st.store_url = "sqlite:" + tmp->path() + "/gateway.db";
  }
  // The gateway's threads: one per client connection (cpp-httplib holds a
  // thread per keep-alive connection), and spares for the latency clients'
  // connections; a PostgreSQL connection per gateway thread.
  const int threads = static_cast<int>(st.clients) + 8;
  auto upstream = Upstream::Start(st.delay_ms);
  if (!upstream.ok()) return Fail(cmd, upstream.status());
  auto gw = InProcessGateway::Start(WithDefaultPoolSize(st.store_url, threads), (*upstream)->port(), threads);
  if (!gw.ok()) return Fail(cmd, gw.status());
  const int up_port = (*upstream)->port(), gw_port = (*gw)->gateway().port();

  Figures f;
  const std::string prefix = "gwb" + std::to_string(Env::Default()->NowMs()) + "-";
  for (int64_t round = 0; round <= st.rounds; ++round) {
    for (const bool latency : {true, false}) Phase(st, up_port, gw_port, prefix, round, latency, f);
    if (round == 0) {
      std::fprintf(stderr, "idem bench gateway: warmed up\n");
      continue;
    }
    const size_t i = static_cast<size_t>(round - 1);
    const double d = f.per_s["direct_first"][i], g = f.per_s["gateway_first"][i], p = f.per_s["pass_first"][i];
    std::fprintf(stderr,
                 "idem bench gateway: round %lld/%lld: first executions %.0f/s direct, %.0f/s gateway (%.3fx), "
                 "%.0f/s unguarded through the gateway (%.3fx)\n",
                 static_cast<long long>(round), static_cast<long long>(st.rounds), d, g, d > 0 ? g / d : 0, p,
                 d > 0 ? p / d : 0);
  }

  // On SQLite, the disk's fdatasync rate: a first execution commits twice
  // (its claim, then its answer), each with an fsync.
  double fsync_per_s = 0;
  const std::string durability = (*gw)->store().durability;  // as the store's settings say
  if (auto o = sqlite::Store::ParseUrl(st.store_url); o.ok() && !IsPostgresScheme(st.store_url)) {
    std::string dir = std::filesystem::path(o->path).parent_path().string();
    auto rate = MeasureFsync(dir.empty() ? "." : dir, 0.5);
    if (!rate.ok()) return Fail(cmd, rate.status());
    fsync_per_s = *rate;
  }

  nlohmann::json j = {{"bench", "gateway"},
                      {"store", (*gw)->store().kind},
                      {"store_url", RedactUrl(st.store_url)},
                      {"durability", durability},
                      {"upstream_delay_ms", st.delay_ms},
                      {"clients", st.clients},
                      {"rounds", st.rounds},
                      {"warmup_requests", std::min(kWarmupRequests, st.requests)}};
  if (fsync_per_s > 0) j["fsync_per_s"] = std::llround(fsync_per_s);
  nlohmann::json lat, tp;
  for (const std::string& m : kModes) {
    std::vector<double> v = f.latency_ms[m];
    std::sort(v.begin(), v.end());
    lat[m] = {{"requests", static_cast<int64_t>(v.size())},
              {"p50_ms", PercentileOfSorted(v, 0.5)},
              {"p99_ms", PercentileOfSorted(v, 0.99)}};
  }
  for (const std::string& m : kThroughputModes)
    tp[m] = {{"requests", st.requests * st.rounds},
             {"per_s_rounds", f.per_s[m]},
             {"median_per_s", Median(f.per_s[m])},
             {"process_cpu_us", Median(f.process_cpu_us[m])},
             {"machine_cpu_us", Median(f.machine_cpu_us[m])},
             {"machine_busy_cores", Median(f.machine_busy_cores[m])},
             {"context_switches", Median(f.switches[m])},
             {"loaded_mean_ms", Median(f.loaded_mean_ms[m])},
             {"loaded_p50_ms", Median(f.loaded_p50_ms[m])},
             {"loaded_p99_ms", Median(f.loaded_p99_ms[m])}};
  for (const std::string kind : {"first", "replay"})
    for (const char* p : {"p50_ms", "p99_ms"})
      lat["added_" + kind][p] = lat["gateway_" + kind][p].get<double>() - lat["direct_" + kind][p].get<double>();
  const std::pair<const char*, std::pair<const char*, const char*>> ratios[] = {
      {"ratio_first", {"gateway_first", "direct_first"}},
      {"ratio_replay", {"gateway_replay", "direct_replay"}},
      {"ratio_pass", {"pass_first", "direct_first"}},
      {"ratio_first_to_pass", {"gateway_first", "pass_first"}}};
  for (const auto& [name, of] : ratios) {
    const std::vector<double> r = Ratios(f, of.first, of.second);
    tp[std::string(name) + "_rounds"] = r;
    tp[name] = Median(r);
  }
  j["latency"] = lat;
  j["throughput"] = tp;
  j["targets"] = {{"replay_added_p99_ms", Target(lat["added_replay"]["p99_ms"].get<double>(), kReplayAddedP99Ms, true)},
                  {"first_added_p99_ms", Target(lat["added_first"]["p99_ms"].get<double>(), kFirstAddedP99Ms, true)},
                  {"throughput_ratio_first", Target(tp["ratio_first"].get<double>(), kThroughputRatio, false)}};

  // The checks: every answer 201; the upstream saw each gateway first
  // execution once and no replay, and each unguarded one; the gateway's
  // counters agree.
  const Upstream::Calls calls = (*upstream)->calls();
  const httplib::Gateway::Counters c = (*gw)->gateway().counters();
  int64_t sent = 0;
  for (const auto& [m, n] : f.sent) sent += n;
  const bool ok = f.unexpected == 0 && calls.gateway == f.sent["gateway_first"] && calls.gateway_repeats == 0 &&
                  calls.direct == f.sent["direct_first"] + f.sent["direct_replay"] &&
                  calls.passed == f.sent["pass_first"] &&
                  static_cast<int64_t>(c.forwarded) == f.sent["gateway_first"] &&
                  static_cast<int64_t>(c.replayed) == f.sent["gateway_replay"] && c.outcome_unknown == 0;
  j["checks"] = {{"requests", sent},
                 {"sent", f.sent},
                 {"not_201", f.unexpected},
                 {"upstream_calls_direct", calls.direct},
                 {"upstream_calls_via_gateway", calls.gateway},
                 {"upstream_repeats_via_gateway", calls.gateway_repeats},
                 {"upstream_calls_unguarded", calls.passed},
                 {"gateway_forwarded", c.forwarded},
                 {"gateway_replayed", c.replayed},
                 {"gateway_outcome_unknown", c.outcome_unknown},
                 {"ok", ok}};
  if (st.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    PrintText(j);
  }
  std::fflush(stdout);
  if (!ok) {
    std::fprintf(stderr, "CORRECTNESS CHECK FAILED: %s\n", j["checks"].dump().c_str());
    return kExitCheckFailed;
  }
  return kExitOk;
}

}  // namespace idem::cli
