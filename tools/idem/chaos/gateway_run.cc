// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos gateway: the run (gateway.h) -- the upstream, the gateway
// processes and their kills, the clients, the check.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include <httplib.h>

#include "chaos/config.h"
#include "chaos/gateway.h"
#include "chaos/process.h"
#include "components.h"
#include "cut_proxy.h"

namespace idem::cli::chaos {
namespace {

std::atomic<bool> g_interrupted{false};

void SleepMs(int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// The API behind the gateways: every POST is one execution, counted per
// Idempotency-Key (as forwarded), answered 201 with a body no other
// execution gets. A share of executions answer only after the gateways'
// upstream timeout (the gateway never learns their outcome).
class Upstream {
 public:
  Status Start(const GatewayConfig& cfg) {
    delay_ms_ = cfg.upstream_delay_ms;
    slow_rate_ = cfg.upstream_lost_rate;
    slow_ms_ = cfg.upstream_timeout_ms + 300;
    rng_.seed(cfg.seed * 7919 + 1);
    server_.new_task_queue = [] { return new ::httplib::ThreadPool(64); };
    server_.set_tcp_nodelay(true);
    server_.Get("/health",
                [](const ::httplib::Request&, ::httplib::Response& res) { res.set_content("ok", "text/plain"); });
    server_.Post(".*", [this](const ::httplib::Request& req, ::httplib::Response& res) { Execute(req, res); });
    port_ = server_.bind_to_any_port("127.0.0.1");
    if (port_ <= 0) return Status::Unavailable("chaos gateway: the upstream cannot listen on 127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    return Status::OK();
  }
  ~Upstream() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }
  int64_t slow() const { return slow_.load(); }
  // Each key's executions: their bodies, in order.
  std::unordered_map<std::string, std::vector<std::string>> Executions() {
    std::lock_guard lock(mu_);
    return runs_;
  }

 private:
  void Execute(const ::httplib::Request& req, ::httplib::Response& res) {
    const std::string key = req.get_header_value("Idempotency-Key");
    int64_t wait = 0;
    bool slow = false;
    std::string body;
    {
      std::lock_guard lock(mu_);
      auto& runs = runs_[key];
      body = "{\"execution\":\"ex_" + std::to_string(++seq_) + "\",\"key\":" + JsonString(key) +
             ",\"nth\":" + std::to_string(runs.size() + 1) + ",\"request_bytes\":" + std::to_string(req.body.size()) +
             "}";
      runs.push_back(body);
      wait = delay_ms_ > 0 ? static_cast<int64_t>(rng_() % static_cast<uint64_t>(delay_ms_ + 1)) : 0;
      slow = slow_rate_ > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < slow_rate_;
    }
    if (slow) {
      ++slow_;
      wait = slow_ms_;
    }
    if (wait > 0) SleepMs(wait);
    res.status = 201;
    res.set_content(body, "application/json");
  }

  ::httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  int64_t delay_ms_ = 0, slow_ms_ = 0;
  double slow_rate_ = 0;
  std::mutex mu_;
  std::mt19937_64 rng_;
  int64_t seq_ = 0;
  std::unordered_map<std::string, std::vector<std::string>> runs_;
  std::atomic<int64_t> slow_{0};
};

// One gateway (or peer) slot: its port (the same across its lives), the
// proxy the clients reach it through, the life running now.
struct Slot {
  int port = 0;
  std::unique_ptr<CutProxy> proxy;
  pid_t pid = 0;
  std::string kill_point;  // armed in this life ("": none)
  int64_t kill_at_ms = 0;  // a timed kill (0: none)
  bool killed_by_us = false;
  int64_t ready_ms = 0;  // when it may start again
  int64_t lives = 0;
};

// What the clients found, per key and in all.
struct Tally {
  std::mutex mu;
  std::map<std::string, std::set<std::string>> bodies_2xx;  // key -> the 2xx bodies clients got
  std::set<std::string> twinned;                            // keys whose first request went twice at once
  std::map<std::string, int64_t> statuses;
  std::vector<std::string> examples;
  std::atomic<int64_t> requests{0}, twins{0}, answered_2xx{0}, outcome_unknown{0}, in_progress{0}, transport_errors{0},
      replay_mismatches{0}, unexpected_statuses{0}, unresolved{0}, keys_done{0};

  void Saw(int status) {
    std::lock_guard lock(mu);
    ++statuses[std::to_string(status)];
  }
  void Example(const std::string& e) {
    std::lock_guard lock(mu);
    if (examples.size() < 8) examples.push_back(e);
  }
  void Body(const std::string& key, const std::string& body) {
    std::lock_guard lock(mu);
    bodies_2xx[key].insert(body);
  }
};

class Run {
 public:
  explicit Run(const GatewayConfig& cfg) : cfg_(cfg), rng_(cfg.seed) {}

  Result<GatewayResult> Go() {
    IDEM_RETURN_IF_ERROR(upstream_.Start(cfg_));
    upstream_url_ = "http://127.0.0.1:" + std::to_string(upstream_.port());
    run_id_ = "r" + std::to_string(cfg_.seed) + "-" + std::to_string(::getpid()) + "-" + std::to_string(SteadyMs());
    slots_.resize(static_cast<size_t>(cfg_.gateways));
    for (size_t i = 0; i < slots_.size(); ++i) {
      // A port of its own (FreePort draws from the clock: the same twice
      // within a millisecond).
      for (bool taken = true; taken;) {
        IDEM_ASSIGN_OR_RETURN(slots_[i].port, FreePort());
        taken = std::any_of(slots_.begin(), slots_.begin() + static_cast<std::ptrdiff_t>(i),
                            [&](const Slot& o) { return o.port == slots_[i].port; });
        if (taken) SleepMs(2);
      }
      IDEM_ASSIGN_OR_RETURN(slots_[i].proxy, CutProxy::Start("127.0.0.1", slots_[i].port));
      slots_[i].proxy->LoseResponses(cfg_.lost_response_rate, cfg_.seed * 31 + i);
    }
    // The first life of each slot up before the clients start (one at a
    // time: the first creates the store's tables).
    for (size_t i = 0; i < slots_.size(); ++i) {
      IDEM_RETURN_IF_ERROR(Start(slots_[i]));
      if (!WaitHealthy(slots_[i]))
        return Status::Unavailable("chaos gateway: " + Name() + " on port " + std::to_string(slots_[i].port) +
                                   " did not come up (see " + LogOf(i) + ")");
    }
    struct sigaction sa {};
    sa.sa_handler = [](int) { g_interrupted = true; };
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);

    const int64_t start = SteadyMs();
    std::vector<std::thread> clients;
    for (int c = 0; c < cfg_.clients; ++c) clients.emplace_back([this, c] { Client(c); });
    int64_t next_progress = start + 2'000;
    while (clients_left_.load() > 0 && !g_interrupted) {
      Supervise();
      const int64_t now = SteadyMs();
      if (now >= next_progress) {
        next_progress = now + 2'000;
        std::cerr << "idem chaos gateway: " << tally_.keys_done.load() << " keys done, " << kills_ << " of "
                  << cfg_.kills << " kills, " << tally_.outcome_unknown.load() << " outcome-unknown, "
                  << tally_.requests.load() << " requests\n"
                  << std::flush;
      }
      SleepMs(5);
    }
    stop_clients_ = true;
    for (auto& t : clients) t.join();
    const double seconds = static_cast<double>(SteadyMs() - start) / 1000.0;
    StopAll();
    return Check(seconds);
  }

 private:
  std::string Name() const { return cfg_.peer_cmd.empty() ? "idem gateway" : "the peer proxy"; }
  std::string LogOf(size_t slot) const { return cfg_.dir + "/gateway-" + std::to_string(slot) + ".log"; }
  int TargetPort(const Slot& s) const { return cfg_.lost_response_rate > 0 ? s.proxy->port() : s.port; }

  // Starts the slot's next life, armed with a kill (a kill point, or a
  // timed kill) while the kills made and armed are fewer than asked.
  Status Start(Slot& s) {
    const size_t index = static_cast<size_t>(&s - slots_.data());
    s.kill_point.clear();
    s.kill_at_ms = 0;
    s.killed_by_us = false;
    std::vector<std::string> env;
    if (kills_ + Armed() < cfg_.kills) {
      // In turn: the kill point between forwarding and storing, a timed
      // kill, that kill point again, the one after the claim, a timed kill
      // (a peer: timed kills only).
      static constexpr const char* kTurns[] = {"http.before_complete", "", "http.before_complete", "http.after_claim",
                                               ""};
      const char* point = cfg_.peer_cmd.empty() ? kTurns[armed_lives_++ % std::size(kTurns)] : "";
      const int64_t hit = 1 + static_cast<int64_t>(rng_() % static_cast<uint64_t>(cfg_.hits));
      s.kill_point = point;
      if (s.kill_point.empty()) s.kill_at_ms = SteadyMs() + 150 + static_cast<int64_t>(rng_() % 1'350);
      if (!s.kill_point.empty()) env.push_back("IDEM_KILL_AT=" + s.kill_point + ":" + std::to_string(hit));
    }
    std::vector<std::string> argv;
    if (cfg_.peer_cmd.empty()) {
      argv = {SelfExe(),
              "gateway",
              "--upstream",
              upstream_url_,
              "--listen",
              "127.0.0.1:" + std::to_string(s.port),
              "--store",
              cfg_.store,
              "--lease",
              std::to_string(cfg_.lease_ms),
              "--upstream-timeout",
              std::to_string(cfg_.upstream_timeout_ms),
              "--connect-timeout",
              std::to_string(cfg_.connect_timeout_ms),
              "--threads",
              "32",
              "--quiet"};
      if (cfg_.broken == kBrokenHonoursKey) argv.emplace_back("--upstream-honours-key");
    } else {
      argv = {"/bin/sh", "-c", cfg_.peer_cmd};
      env.push_back("PORT=" + std::to_string(s.port));
      env.push_back("UPSTREAM=" + upstream_url_);
      env.push_back("UPSTREAM_TIMEOUT_MS=" + std::to_string(cfg_.upstream_timeout_ms));
    }
    IDEM_ASSIGN_OR_RETURN(s.pid, Spawn(argv, env, LogOf(index)));
    ++s.lives;
    return Status::OK();
  }

  int64_t Armed() const {
    int64_t n = 0;
    for (const Slot& s : slots_) n += s.pid > 0 && (!s.kill_point.empty() || s.kill_at_ms > 0) ? 1 : 0;
    return n;
  }

  bool WaitHealthy(const Slot& s) {
    for (int i = 0; i < 600; ++i) {
      ::httplib::Client c("127.0.0.1", s.port);
      c.set_connection_timeout(0, 200'000);
      c.set_read_timeout(1, 0);
      if (auto r = c.Get("/health"); r && r->status == 200) return true;
      int st = 0;
      if (::waitpid(s.pid, &st, WNOHANG) == s.pid) return false;
      SleepMs(50);
    }
    return false;
  }

  // Reaps what ended, counts the kills, kills what is due, restarts.
  void Supervise() {
    int st = 0;
    pid_t pid = 0;
    const int64_t now = SteadyMs();
    while ((pid = ::waitpid(-1, &st, WNOHANG)) > 0) {
      for (Slot& s : slots_) {
        if (s.pid != pid) continue;
        s.pid = 0;
        s.ready_ms = now + 30 + static_cast<int64_t>(rng_() % 120);
        if (s.killed_by_us) {
          ++kills_;
          ++kills_by_point_["kill:timed"];
        } else if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && !s.kill_point.empty()) {
          ++kills_;
          ++kills_by_point_["kill:" + s.kill_point];
        } else {
          ++start_failures_;  // it exited on its own (its store unreachable at start, say)
        }
      }
    }
    for (Slot& s : slots_) {
      if (s.pid == 0 && now >= s.ready_ms) {
        if (Status started = Start(s); started.ok()) {
          ++restarts_;
        } else {
          std::cerr << "idem chaos gateway: " << started << "\n";
          s.ready_ms = now + 500;
        }
      } else if (s.pid > 0 && s.kill_at_ms > 0 && now >= s.kill_at_ms && !s.killed_by_us) {
        ::kill(s.pid, SIGKILL);
        s.killed_by_us = true;
      }
    }
  }

  void StopAll() {
    for (Slot& s : slots_)
      if (s.pid > 0) ::kill(s.pid, SIGTERM);
    for (Slot& s : slots_) {
      if (s.pid <= 0) continue;
      int st = 0;
      for (int i = 0; i < 200 && ::waitpid(s.pid, &st, WNOHANG) == 0; ++i) SleepMs(10);
      if (::kill(s.pid, 0) == 0) {
        ::kill(s.pid, SIGKILL);
        ::waitpid(s.pid, &st, 0);
      }
      s.pid = 0;
    }
  }

  // One answer to a POST (status 0: none came).
  struct Answer {
    int status = 0;
    std::string body;
  };

  // Sends the key's request to one of the gateways, picked by `rng`.
  Answer Send(std::map<int, std::unique_ptr<::httplib::Client>>& conns, std::mt19937_64& rng, const std::string& key,
              const std::string& principal, const std::string& body) {
    const Slot& s = slots_[static_cast<size_t>(rng() % slots_.size())];
    auto& c = conns[TargetPort(s)];
    if (!c) {
      c = std::make_unique<::httplib::Client>("127.0.0.1", TargetPort(s));
      c->set_keep_alive(true);
      c->set_tcp_nodelay(true);  // a request's header and body go out at once
      c->set_connection_timeout(1, 0);
      c->set_read_timeout(10, 0);
    }
    ++tally_.requests;
    ::httplib::Headers h = {{"Idempotency-Key", key}, {"Authorization", principal}};
    auto r = c->Post("/v1/charges", h, body, "application/json");
    if (!r) {
      ++tally_.transport_errors;
      return {};
    }
    tally_.Saw(r->status);
    return {r->status, r->body};
  }

  static bool Is2xx(int status) { return status >= 200 && status < 300; }
  static bool Retryable(int status) {
    return status == 409 || status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
  }
  bool FinalUnknown(const Answer& a) const {
    return a.status == 503 && a.body.find("outcome-unknown") != std::string::npos &&
           a.body.find("\"retry\":\"same-key\"") == std::string::npos;
  }

  void Client(int c) {
    std::mt19937_64 rng(cfg_.seed * 1'000'003 + static_cast<uint64_t>(c));
    std::map<int, std::unique_ptr<::httplib::Client>> conns;
    for (;;) {
      const int64_t i = next_key_.fetch_add(1);
      // At least --keys keys, and more while the kills are not all made
      // (at most 20 times as many).
      if (stop_clients_ || g_interrupted || (i >= cfg_.keys && (kills_ >= cfg_.kills || i >= 20 * cfg_.keys))) break;
      OneKey(i, conns, rng);
      ++tally_.keys_done;
    }
    --clients_left_;
  }

  void OneKey(int64_t i, std::map<int, std::unique_ptr<::httplib::Client>>& conns, std::mt19937_64& rng) {
    const std::string key = "\"" + run_id_ + "-" + std::to_string(i) + "\"";
    const std::string principal = "Bearer chaos-client-" + std::to_string(i % 4);
    const std::string body = "{\"amount\":" + std::to_string(1000 + i % 97) + ",\"order\":\"o" + std::to_string(i) +
                             "\",\"currency\":\"usd\"}";
    const int64_t deadline = SteadyMs() + cfg_.key_timeout_ms;
    std::thread twin;
    if (cfg_.twin_rate > 0 && std::uniform_real_distribution<double>(0, 1)(rng) < cfg_.twin_rate) {
      ++tally_.twins;
      {
        std::lock_guard lock(tally_.mu);
        tally_.twinned.insert(key);
      }
      twin = std::thread([this, key, principal, body, seed = rng()] {
        std::mt19937_64 r(seed);
        std::map<int, std::unique_ptr<::httplib::Client>> own;
        if (Answer a = Send(own, r, key, principal, body); Is2xx(a.status)) tally_.Body(key, a.body);
      });
    }
    auto pause = [&](int64_t lo, int64_t hi) { SleepMs(lo + static_cast<int64_t>(rng() % (hi - lo + 1))); };
    std::string first;
    bool unknown = false;
    for (;;) {
      if (SteadyMs() > deadline || stop_clients_) {
        ++tally_.unresolved;
        tally_.Example("key " + key + ": no final answer within " + std::to_string(cfg_.key_timeout_ms) + " ms");
        break;
      }
      const Answer a = Send(conns, rng, key, principal, body);
      if (a.status == 0) {
        pause(2, 20);
        continue;
      }
      if (Is2xx(a.status)) {
        first = a.body;
        break;
      }
      if (FinalUnknown(a)) {
        unknown = true;
        break;
      }
      if (Retryable(a.status)) {
        if (a.status == 409) ++tally_.in_progress;
        pause(20, 80);
        continue;
      }
      ++tally_.unexpected_statuses;
      tally_.Example("key " + key + ": answered " + std::to_string(a.status) + " " + a.body.substr(0, 200));
      break;
    }
    if (unknown) ++tally_.outcome_unknown;
    if (!first.empty()) {
      ++tally_.answered_2xx;
      tally_.Body(key, first);
      // Repeats: the same answer every time, whichever gateway answers.
      for (int r = 0; r < cfg_.repeats; ++r) {
        for (;;) {
          if (SteadyMs() > deadline || stop_clients_) {
            ++tally_.unresolved;
            tally_.Example("key " + key + ": a repeat after a 2xx got no answer in time");
            break;
          }
          const Answer a = Send(conns, rng, key, principal, body);
          if (a.status == 0 || (Retryable(a.status) && !FinalUnknown(a))) {
            // Not an answer to compare (a client retries it): the key's
            // record is still being written, say, or the store is away.
            if (a.status == 409) ++tally_.in_progress;
            pause(2, 20);
            continue;
          }
          if (Is2xx(a.status)) {
            tally_.Body(key, a.body);
          } else {
            ++tally_.replay_mismatches;
            tally_.Example("key " + key + ": a repeat after " + first + " got " + std::to_string(a.status) + " " +
                           a.body.substr(0, 200));
          }
          break;
        }
      }
    }
    if (twin.joinable()) twin.join();
    std::lock_guard lock(tally_.mu);
    const auto it = tally_.bodies_2xx.find(key);
    if (it != tally_.bodies_2xx.end() && (it->second.size() > 1 || unknown)) {
      ++tally_.replay_mismatches;
      if (tally_.examples.size() < 8)
        tally_.examples.push_back("key " + key + ": " + std::to_string(it->second.size()) + " different 2xx bodies" +
                                  (unknown ? " and an outcome-unknown answer" : ""));
    }
  }

  GatewayResult Check(double seconds) {
    GatewayResult r;
    r.store_kind = !cfg_.peer_cmd.empty() ? "peer" : IsPostgresScheme(cfg_.store) ? "postgres" : "sqlite";
    r.keys = tally_.keys_done.load();
    r.requests = tally_.requests.load();
    r.twins = tally_.twins.load();
    r.answered_2xx = tally_.answered_2xx.load();
    r.outcome_unknown = tally_.outcome_unknown.load();
    r.in_progress = tally_.in_progress.load();
    r.transport_errors = tally_.transport_errors.load();
    r.replay_mismatches = tally_.replay_mismatches.load();
    r.unexpected_statuses = tally_.unexpected_statuses.load();
    r.unresolved = tally_.unresolved.load();
    for (const Slot& s : slots_) r.responses_lost += s.proxy->responses_lost();
    r.upstream_timeouts = upstream_.slow();
    r.kills_by_point = kills_by_point_;
    r.kills = kills_;
    r.restarts = restarts_;
    r.start_failures = start_failures_;
    r.seconds = seconds;
    r.kills_reached = kills_ >= cfg_.kills;
    r.interrupted = g_interrupted;
    r.statuses = tally_.statuses;
    r.examples = tally_.examples;
    const auto runs = upstream_.Executions();
    for (const auto& [key, bodies] : runs) {
      r.executions += static_cast<int64_t>(bodies.size());
      ++r.executed_keys;
      if (bodies.size() > 1) {
        ++r.duplicated_keys;
        r.duplicate_executions += static_cast<int64_t>(bodies.size()) - 1;
        r.duplicated_twinned_keys += tally_.twinned.count(key) > 0 ? 1 : 0;
        if (r.examples.size() < 8)
          r.examples.push_back("key " + key + ": executed " + std::to_string(bodies.size()) + " times upstream");
      }
    }
    for (const auto& [key, seen] : tally_.bodies_2xx) {
      const auto it = runs.find(key);
      for (const std::string& b : seen) {
        if (it != runs.end() && std::find(it->second.begin(), it->second.end(), b) != it->second.end()) continue;
        ++r.unexpected_bodies;
        if (r.examples.size() < 8) r.examples.push_back("key " + key + ": a 2xx body the upstream never made: " + b);
      }
    }
    return r;
  }

  const GatewayConfig& cfg_;
  std::mt19937_64 rng_;  // the supervisor's: kill plans, restart delays
  Upstream upstream_;
  std::string upstream_url_, run_id_;
  std::vector<Slot> slots_;
  Tally tally_;
  std::atomic<int64_t> next_key_{0};
  std::atomic<int> clients_left_{cfg_.clients};
  std::atomic<bool> stop_clients_{false};
  std::atomic<int64_t> kills_{0};
  std::map<std::string, int64_t> kills_by_point_;
  int64_t restarts_ = 0, start_failures_ = 0, armed_lives_ = 0;
};

}  // namespace

Result<GatewayResult> RunGatewayChaos(const GatewayConfig& cfg) {
  Run run(cfg);
  return run.Go();
}

}  // namespace idem::cli::chaos
