// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/http/idempotency.h"
#include "idem/testing/kill_points.h"

#include <pthread.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <nlohmann/json.hpp>

#include "http/fiber.h"

namespace idem::http {
namespace {

// A client's text in a log line, as one token: as it is when it holds only
// characters that cannot split or fake a field, else quoted with " and a
// backslash escaped and other bytes as \xHH (a key "x replayed 201" must not read as
// an outcome).
std::string LogToken(std::string_view s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_.:/@+", c) != nullptr;
  });
  if (plain) return std::string(s);
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

thread_local const ClaimToken* g_current_claim = nullptr;

// Headers that belong to one connection, not to the response: never stored.
bool HopByHop(std::string_view name) {
  static const char* const kSkip[] = {"connection", "keep-alive", "transfer-encoding", "content-length",
                                      "date", "idempotent-replayed", "idempotency-key-retention"};
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return std::any_of(std::begin(kSkip), std::end(kSkip), [&](const char* s) { return lower == s; });
}

void PutU32(std::string& out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutBytes(std::string& out, std::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool U32(uint32_t* v) {
    if (in_.size() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v = (*v << 8) | static_cast<unsigned char>(in_[i]);
    in_.remove_prefix(4);
    return true;
  }
  bool Bytes(std::string* s) {
    uint32_t n = 0;
    if (!U32(&n) || in_.size() < n) return false;
    s->assign(in_.substr(0, n));
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }

 private:
  std::string_view in_;
};

constexpr char kMagic[] = "idem-http-1";

std::string ScopeOf(const std::string& principal, const std::string& method, const std::string& route) {
  std::string scope = principal + "|" + method + " " + route;
  // A scope is at most 255 bytes: a long principal or route is hashed.
  if (scope.size() > 255) scope = "sha256:" + ToHex(FingerprintOf(scope));
  return scope;
}

std::string RetryAfterSeconds(int64_t retry_at_ms, int64_t now_ms) {
  return std::to_string(std::max<int64_t>(1, (retry_at_ms - now_ms + 999) / 1000));
}

// The stored form of a handler's response (hop-by-hop headers left out).
StoredResponse StoredOf(const httplib::Response& res) {
  StoredResponse stored{res.status, {}, res.body};
  for (const auto& [k, v] : res.headers)
    if (!HopByHop(k)) stored.headers.emplace_back(k, v);
  return stored;
}

}  // namespace

Authenticator BearerKeys(std::map<std::string, std::string> keys) {
  return [keys = std::move(keys)](const httplib::Request& req) -> std::optional<std::string> {
    const std::string auth = req.get_header_value("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (auth.size() <= kBearer.size() || auth.compare(0, kBearer.size(), kBearer) != 0) return std::nullopt;
    auto it = keys.find(auth.substr(kBearer.size()));
    if (it == keys.end()) return std::nullopt;
    return it->second;
  };
}

std::string Encode(const StoredResponse& r) {
  std::string out(kMagic);
  PutU32(out, static_cast<uint32_t>(r.status));
  PutU32(out, static_cast<uint32_t>(r.headers.size()));
  for (const auto& [k, v] : r.headers) {
    PutBytes(out, k);
    PutBytes(out, v);
  }
  PutBytes(out, r.body);
  return out;
}

Result<StoredResponse> Decode(std::string_view bytes) {
  const size_t magic = std::strlen(kMagic);
  if (bytes.substr(0, magic) != kMagic) return Status::Corruption("stored response is not idem's HTTP format");
  Reader in(bytes.substr(magic));
  StoredResponse r;
  uint32_t status = 0, n = 0;
  if (!in.U32(&status) || !in.U32(&n)) return Status::Corruption("stored response truncated");
  r.status = static_cast<int>(status);
  for (uint32_t i = 0; i < n; ++i) {
    std::string k, v;
    if (!in.Bytes(&k) || !in.Bytes(&v)) return Status::Corruption("stored response header truncated");
    r.headers.emplace_back(std::move(k), std::move(v));
  }
  if (!in.Bytes(&r.body) || !in.done()) return Status::Corruption("stored response body truncated");
  return r;
}

Result<std::string> ParseKey(std::string_view v) {
  // Optional whitespace around the item is allowed by HTTP field parsing.
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (v.empty()) return Status::InvalidArgument("Idempotency-Key is empty");
  std::string key;
  if (v.front() != '"') {
    // A bare token, as Stripe's client libraries send a key: the same key as
    // its quoted form. A comma would make it a list, a quote or backslash
    // would read differently quoted.
    for (unsigned char c : v) {
      if (c == ' ' || c == '\t')
        return Status::InvalidArgument("Idempotency-Key: a key with spaces must be a quoted string (\"...\")");
      if (c < 0x21 || c > 0x7e)
        return Status::InvalidArgument("Idempotency-Key: only printable ASCII characters are allowed");
      if (c == ',') return Status::InvalidArgument("Idempotency-Key: send one key, not a list");
      if (c == '"' || c == '\\')
        return Status::InvalidArgument(
            "Idempotency-Key: an unquoted key cannot hold \" or \\ (send it as a quoted string with them escaped)");
    }
    key = std::string(v);
  } else {
    if (v.size() < 2 || v.back() != '"')
      return Status::InvalidArgument("Idempotency-Key: the quoted string has no closing quote");
    for (size_t i = 1; i + 1 < v.size(); ++i) {
      unsigned char c = static_cast<unsigned char>(v[i]);
      if (c == '\\') {
        if (i + 2 >= v.size() || (v[i + 1] != '"' && v[i + 1] != '\\'))
          return Status::InvalidArgument("Idempotency-Key: a backslash may only escape \" or \\");
        key += v[++i];
        continue;
      }
      if (c == '"') return Status::InvalidArgument("Idempotency-Key: an unescaped quote inside the string");
      if (c < 0x20 || c > 0x7e)
        return Status::InvalidArgument("Idempotency-Key: only printable ASCII characters are allowed");
      key += static_cast<char>(c);
    }
  }
  if (key.empty()) return Status::InvalidArgument("Idempotency-Key is empty");
  if (key.size() > 255)
    return Status::InvalidArgument("Idempotency-Key is " + std::to_string(key.size()) + " characters; at most 255");
  return key;
}

// Whether JSON text nests arrays and objects at most `max` deep (strings
// skipped). A deeper body is not canonicalised: dump() recurses once per
// level, and 100,000 levels in a 200 KB body would overflow the stack.
bool NestsAtMost(std::string_view body, int max) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

std::optional<std::string> CanonicalJson(std::string_view body) {
  // Deeper than any request a route means: fingerprinted as bytes instead.
  if (!NestsAtMost(body, 128)) return std::nullopt;
  // nlohmann::json keeps objects in a std::map: dump() writes keys sorted,
  // without whitespace.
  nlohmann::json j = nlohmann::json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j.dump();
}

Fingerprint RequestFingerprint(std::string_view method, std::string_view route, std::string_view body) {
  std::string material(method);
  material += '\0';
  material += route;
  material += '\0';
  if (auto canonical = CanonicalJson(body)) {
    material += "json:";
    material += *canonical;
  } else {
    material += "raw:";
    material += body;
  }
  return FingerprintOf(material);
}

const ClaimToken* CurrentClaim() { return g_current_claim; }

// One request of a transactional route on its way through a group.
struct Idempotency::GroupJob {
  const RoutePolicy* policy = nullptr;
  const TxHandler* handler = nullptr;
  const httplib::Request* req = nullptr;
  httplib::Response* res = nullptr;
  ClaimRequest request;
  enum class Fate {
    kPending,
    kDone,          // executed; committed with the group; the response is in *res
    kOutcome,       // the key was not started (replay, conflict, in progress): `outcome`
    kAlone,         // run it in a transaction of its own (its response is not kept, or the group failed)
    kCommitFailed,  // the group's commit failed or is in doubt: `error`
  };
  Fate result = Fate::kPending;
  ClaimOutcome outcome;
  Status error;
  std::atomic<bool> decided{false};
  internal::Fiber* fiber = nullptr;  // a Server's fiber waits for the decision here (set_fibers)
};

// Threads that take the queued jobs, as many as Options::group_commit_max,
// and run each group in one transaction (Idempotency::RunGroup).
class Idempotency::Committer {
 public:
  Committer(Idempotency& owner, Store& store, int max, int threads) : owner_(owner), store_(store), max_(max) {
    for (int i = 0; i < std::max(1, threads); ++i)
      threads_.emplace_back([this] {
        ::pthread_setname_np(::pthread_self(), "idem-committer");  // in ps -L, top -H, gdb
        Loop();
      });
  }
  ~Committer() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // Queues `job` and returns once its group decided it. The queue holds a
  // reference too: the job outlives the notify even if its waiter returns
  // as soon as it sees the decision.
  void Run(const std::shared_ptr<GroupJob>& job) {
    job->fiber = internal::CurrentFiber();
    {
      std::lock_guard lock(mu_);
      queue_.push_back(job);
      queued_.store(queue_.size(), std::memory_order_relaxed);
    }
    cv_.notify_one();
    if (job->fiber != nullptr) {
      // Its thread serves other connections meanwhile; the only Wake of a
      // parked fiber is the committer's, after the decision.
      internal::ParkUntilWoken();
      return;
    }
    job->decided.wait(false, std::memory_order_acquire);
  }
  Store& store() const { return store_; }
  uint64_t queued() const { return queued_.load(std::memory_order_relaxed); }

 private:
  void Loop() {
    std::vector<std::shared_ptr<GroupJob>> held;
    std::vector<GroupJob*> group;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        const size_t n = std::min(queue_.size(), static_cast<size_t>(max_));
        held.assign(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
        queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
        queued_.store(queue_.size(), std::memory_order_relaxed);
      }
      group.clear();
      for (const auto& job : held) group.push_back(job.get());
      owner_.RunGroup(store_, group);
      for (const auto& job : held) {
        job->decided.store(true, std::memory_order_release);
        if (job->fiber != nullptr) {
          internal::Wake(job->fiber);
        } else {
          job->decided.notify_one();
        }
      }
      held.clear();
    }
  }

  Idempotency& owner_;
  Store& store_;
  const int max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GroupJob>> queue_;
  bool stopping_ = false;
  std::atomic<uint64_t> queued_{0};
  std::vector<std::thread> threads_;
};

Idempotency::Idempotency(Claims& claims, Authenticator authenticate, Options options)
    : claims_(claims), authenticate_(std::move(authenticate)), options_(std::move(options)) {
  if (options_.env == nullptr) options_.env = Env::Default();
  // Set-up mistakes fail at start-up, not as a 5xx on every request (Claims
  // are valid by construction: Claims::Open checks their options).
  if (!authenticate_) throw std::invalid_argument("Idempotency: the Authenticator is empty");
}

Idempotency::~Idempotency() { committer_.reset(); }  // its threads first: they use the rest

bool Idempotency::Threw(std::string_view who, httplib::Response& res, const std::function<void()>& run) {
  std::string what;
  try {
    run();
    return false;
  } catch (const std::exception& e) {
    what = std::string(who) + " threw: " + e.what();
  } catch (...) {
    what = std::string(who) + " threw";
  }
  res = httplib::Response();
  Problem(res, 500, "handler-failed", "Internal error", what, "same-key");
  return true;
}

bool Idempotency::Kept(const RoutePolicy& policy, int status) {
  return (status < 400) || (status >= 500 && policy.store_5xx) ||
         (status >= 400 && status < 500 && policy.stored_4xx.count(status));
}

void Idempotency::Execute(const ClaimToken& token, httplib::Response& res, const std::function<void()>& run) {
  g_current_claim = &token;
  (void)Threw("the handler", res, run);
  g_current_claim = nullptr;
  res.set_header("Idempotency-Key-Retention", Retention());
}

// One transaction for the whole group: every job's claim (in one call, one
// round trip on PostgreSQL), each started job's handler in turn, their stored
// responses (one call again), then one commit. A job whose response is not
// kept (or that is over its key limit) is taken out and the rest run again
// without it; any store error sends every job of the group to a transaction
// of its own. A key twice in one group: the first job executes it, and the
// later one claims after the completions, so it finds the stored response
// (a replay, after the commit) or a conflict.
void Idempotency::RunGroup(Store& store, const std::vector<GroupJob*>& group) {
  using R = GroupJob::Fate;
  std::vector<GroupJob*> live = group;
  while (!live.empty()) {
    auto t = store.BeginDeferred();  // BEGIN goes with the claims where the store can
    if (!t.ok()) {
      for (GroupJob* j : live) j->result = R::kAlone;  // each reports the store's error itself
      return;
    }
    StoreTransaction& tx = **t;
    // Each job's key once in the first pass; the repeats in a second one.
    std::vector<GroupJob*> passes[2];
    {
      std::set<std::pair<std::string_view, std::string_view>> seen;
      for (GroupJob* j : live) passes[seen.insert({j->request.scope, j->request.key}).second ? 0 : 1].push_back(j);
    }
    bool failed = false;
    GroupJob* out = nullptr;
    for (const std::vector<GroupJob*>& pass : passes) {
      if (pass.empty()) continue;
      std::vector<ClaimRequest> requests;
      for (GroupJob* j : pass) requests.push_back(j->request);
      std::vector<Result<ClaimOutcome>> claimed = tx.ClaimManyInTransaction(requests);
      struct Started {
        GroupJob* job;
        ClaimToken token;
        std::string stored;  // the encoded response
      };
      std::vector<Started> started;
      for (size_t k = 0; k < pass.size(); ++k) {
        GroupJob* j = pass[k];
        *j->res = httplib::Response();
        if (k >= claimed.size() || !claimed[k].ok()) {
          failed = true;
          break;
        }
        ClaimOutcome& c = *claimed[k];
        if (c.kind != ClaimOutcome::Kind::kStarted) {
          j->result = R::kOutcome;
          j->outcome = std::move(c);
          continue;
        }
        auto under = UnderLimit(j->request.scope);
        if (!under.ok() || !*under) {
          out = j;
          break;
        }
        Execute(c.token, *j->res, [&] { (*j->handler)(*j->req, *j->res, tx); });
        if (!Kept(*j->policy, j->res->status)) {
          out = j;
          break;
        }
        started.push_back({j, c.token, Encode(StoredOf(*j->res))});
      }
      if (failed || out != nullptr) break;
      std::vector<Completion> completions;  // pointing into `started`, which no longer grows
      for (const Started& st : started)
        completions.push_back(Completion{&st.token, st.stored, /*is_error=*/st.job->res->status >= 500});
      for (const Status& done : tx.CompleteManyInTransaction(completions, claims_.options().retention_ms))
        failed = failed || !done.ok();
      if (failed) break;
      for (const Started& st : started) st.job->result = R::kDone;
    }
    if (failed) {
      tx.Rollback();
      for (GroupJob* j : live) j->result = R::kAlone;
      return;
    }
    if (out != nullptr) {  // again without it
      tx.Rollback();
      group_reruns_.fetch_add(1, std::memory_order_relaxed);
      out->result = R::kAlone;
      live.erase(std::find(live.begin(), live.end(), out));
      continue;
    }
    IDEM_KILL_POINT("http.group_before_commit");
    Status committed = tx.Commit();
    if (committed.ok()) IDEM_KILL_POINT("http.group_after_commit");
    if (!committed.ok()) {
      for (GroupJob* j : live) {
        j->result = R::kCommitFailed;
        j->error = committed;
      }
      return;
    }
    group_commits_.fetch_add(1, std::memory_order_relaxed);
    grouped_requests_.fetch_add(live.size(), std::memory_order_relaxed);
    return;
  }
}

namespace {
// Set-up mistakes in a route fail when it is wrapped, not as a 5xx on every
// request.
void CheckRoute(const char* where, const std::string& route, const RoutePolicy& policy) {
  if (route.empty()) throw std::invalid_argument(std::string(where) + ": the route name is empty (it scopes the keys)");
  if (policy.lease_ms <= 0)
    throw std::invalid_argument(std::string(where) + ": RoutePolicy::lease_ms must be > 0, got " +
                                std::to_string(policy.lease_ms));
  if (policy.wait_ms < 0)
    throw std::invalid_argument(std::string(where) + ": RoutePolicy::wait_ms cannot be negative, got " +
                                std::to_string(policy.wait_ms));
}
}  // namespace

httplib::Server::Handler Idempotency::WrapInTransaction(std::string route, RoutePolicy policy, Store& store,
                                                         TxHandler handler) {
  CheckRoute("Idempotency::WrapInTransaction", route, policy);
  if (store.claim_store() != &claims_.store())
    throw std::invalid_argument("WrapInTransaction: the store must be the database the Claims keep their records in");
  if (options_.group_commit_max > 1 && committer_ == nullptr)
    committer_ = std::make_unique<Committer>(*this, store, options_.group_commit_max, options_.group_committers);
  return [this, route = std::move(route), policy = std::move(policy), &store, handler = std::move(handler)](
             const httplib::Request& req, httplib::Response& res) {
    Handle(route, policy, nullptr, &store, &handler, req, res);
  };
}

httplib::Server::Handler Idempotency::Wrap(std::string route, RoutePolicy policy, httplib::Server::Handler handler) {
  CheckRoute("Idempotency::Wrap", route, policy);
  return [this, route = std::move(route), policy = std::move(policy), handler = std::move(handler)](
             const httplib::Request& req, httplib::Response& res) { Handle(route, policy, handler, req, res); };
}

Idempotency::Counters Idempotency::counters() const {
  Counters c;
  c.executed = executed_.load();
  c.replayed = replayed_.load();
  c.conflicts = conflicts_.load();
  c.in_progress = in_progress_.load();
  c.rejected = rejected_.load();
  c.group_commits = group_commits_.load();
  c.grouped_requests = grouped_requests_.load();
  c.group_queue = committer_ ? committer_->queued() : 0;
  c.group_reruns = group_reruns_.load();
  c.invalid = invalid_.load();
  return c;
}

void Idempotency::Problem(httplib::Response& res, int status, std::string_view type, std::string_view title,
                          std::string detail, std::string_view retry, const std::string& retry_after) {
  nlohmann::json j = {{"type", options_.problem_base + "/" + std::string(type)},
                      {"title", title},
                      {"status", status},
                      {"detail", detail},
                      {"retry", retry}};
  res.status = status;
  res.set_content(j.dump(), "application/problem+json");
  res.set_header("Idempotency-Key-Retention", Retention());
  if (!retry_after.empty()) res.set_header("Retry-After", retry_after);
}

std::string Idempotency::Retention() const { return std::to_string(claims_.options().retention_ms / 1000); }

void Idempotency::CountNewKey(const std::string& scope) {
  std::lock_guard lock(counts_mu_);
  ++counts_[scope].count;
}

Result<bool> Idempotency::UnderLimit(const std::string& scope) {
  const int64_t now = options_.env->NowMs();
  {
    std::lock_guard lock(counts_mu_);
    KeyCount& c = counts_[scope];
    if (c.counted_at_ms >= 0 && now - c.counted_at_ms < 1000) return c.count < options_.max_keys_per_principal;
  }
  IDEM_ASSIGN_OR_RETURN(int64_t n, claims_.store().CountClaims(scope));
  // The count includes this request's own claim (taken before the check,
  // added by the caller once allowed): the others are n - 1.
  const int64_t others = std::max<int64_t>(0, n - 1);
  std::lock_guard lock(counts_mu_);
  counts_[scope] = KeyCount{now, others};
  return others < options_.max_keys_per_principal;
}

void Idempotency::Handle(const std::string& route, const RoutePolicy& policy, const httplib::Server::Handler& handler,
                         const httplib::Request& req, httplib::Response& res) {
  Handle(route, policy, handler, nullptr, nullptr, req, res);
}

void Idempotency::Handle(const std::string& route, const RoutePolicy& policy, const httplib::Server::Handler& handler,
                         Store* store, const TxHandler* tx_handler, const httplib::Request& req,
                         httplib::Response& res) {
  // A transactional route runs its handler in `tx`, which also holds the
  // key's record: claim, effect and stored response commit together.
  std::unique_ptr<StoreTransaction> tx;
  auto run_unguarded = [&] {
    if (tx_handler == nullptr) return handler(req, res);
    auto t = store->BeginDeferred();
    if (!t.ok()) return Problem(res, 503, "store-unavailable", "Store unavailable", t.status().ToString(), "same-key");
    (*tx_handler)(req, res, **t);
    if (res.status < 400) {
      if (Status c = (*t)->Commit(); !c.ok()) Problem(res, 503, "store-unavailable", "Commit failed", c.ToString(), "same-key");
    }
  };
  if (!policy.methods.count(req.method)) return run_unguarded();
  auto say = [&](std::string_view key, std::string_view outcome) {
    if (log)
      log(req.method + " " + LogToken(req.path) + " key=" + LogToken(key) + " " + std::string(outcome) + " " +
          std::to_string(res.status));
  };
  auto reject = [&](std::string_view key, std::string_view outcome) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    say(key, outcome);
  };
  std::optional<std::string> principal = authenticate_(req);
  if (!principal) {
    Problem(res, 401, "unauthenticated", "Unauthenticated", "send Authorization: Bearer <API key>", "no");
    return reject("-", "unauthenticated");
  }
  if (req.body.size() > options_.max_body_bytes) {
    Problem(res, 413, "body-too-large", "Request body too large",
            "the body is " + std::to_string(req.body.size()) + " bytes; at most " +
                std::to_string(options_.max_body_bytes),
            "new-key");
    return reject("-", "too-large");
  }
  if (!req.has_header("Idempotency-Key")) {
    if (!policy.require_key) return run_unguarded();
    Problem(res, 400, "idempotency-key-missing", "Idempotency-Key missing",
            "this endpoint requires an Idempotency-Key header (1 to 255 characters: a quoted string, or a token such as "
            "a UUID)", "new-key");
    return reject("-", "missing-key");
  }
  if (req.get_header_value_count("Idempotency-Key") > 1) {
    Problem(res, 400, "idempotency-key-malformed", "Idempotency-Key malformed",
            "send exactly one Idempotency-Key header", "new-key");
    return reject("-", "malformed-key");
  }
  Result<std::string> key = ParseKey(req.get_header_value("Idempotency-Key"));
  if (!key.ok()) {
    Problem(res, 400, "idempotency-key-malformed", "Idempotency-Key malformed", key.status().message(), "new-key");
    return reject("-", "malformed-key");
  }
  if (policy.validate) {
    bool valid = false;
    (void)Threw("validate", res, [&] { valid = policy.validate(req, res); });
    if (!valid) {
      if (res.status < 400) {  // refused without saying why
        res = httplib::Response();
        Problem(res, 400, "invalid-request", "Invalid request",
                "the request was refused before it ran; correct it and send it again, with the same key if you like",
                "same-key");
      }
      invalid_.fetch_add(1, std::memory_order_relaxed);
      return reject(*key, "invalid");
    }
  }
  const std::string scope = ScopeOf(*principal, req.method, route);
  const Fingerprint fp = RequestFingerprint(req.method, route, req.body);

  auto replay = [&](const std::string& stored) {
    auto r = Decode(stored);
    if (!r.ok()) {
      Problem(res, 500, "stored-response-corrupt", "Stored response unreadable", r.status().ToString(), "no");
      return reject(*key, "corrupt");
    }
    res.status = r->status;
    for (auto& [k, v] : r->headers) res.set_header(k, v);
    res.body = std::move(r->body);
    res.set_header("Idempotent-Replayed", "true");
    res.set_header("Idempotency-Key-Retention", Retention());
    replayed_.fetch_add(1, std::memory_order_relaxed);
    say(*key, "replayed");
  };

  const ClaimRequest request{
      .scope = scope, .key = *key, .fingerprint = fp, .lease_ms = policy.lease_ms, .wait_ms = policy.wait_ms};
  Result<ClaimOutcome> claim = Status::Internal("not claimed");
  std::optional<ClaimOutcome> peeked;
  if (tx_handler != nullptr) {
    // One read answers replays, conflicts and keys in progress without a
    // transaction; only a key to start opens one.
    auto peek = claims_.store().Peek(request);
    if (peek.ok() && peek->has_value()) peeked = std::move(**peek);
  }
  // Nothing committed or everything (in doubt): a retry with the key gets
  // either a fresh execution or the replay, never a second effect.
  auto commit_failed = [&](const Status& why) {
    res = httplib::Response();
    Problem(res, 503, "commit-failed", "Commit failed",
            "the request's effect and stored response could not be committed (" + why.ToString() +
                "); retry with the same key",
            "same-key", "1");
    reject(*key, "commit-failed");
  };
  bool decided = false;
  if (peeked.has_value()) {
    claim = std::move(*peeked);
    decided = true;
  } else if (tx_handler != nullptr && committer_ != nullptr) {
    auto job = std::make_shared<GroupJob>();
    job->policy = &policy;
    job->handler = tx_handler;
    job->req = &req;
    job->res = &res;
    job->request = request;
    committer_->Run(job);
    switch (job->result) {
      case GroupJob::Fate::kDone:
        executed_.fetch_add(1, std::memory_order_relaxed);
        CountNewKey(scope);
        return say(*key, "executed");
      case GroupJob::Fate::kCommitFailed:
        return commit_failed(job->error);
      case GroupJob::Fate::kOutcome:
        claim = std::move(job->outcome);
        decided = true;
        break;
      case GroupJob::Fate::kAlone:
      case GroupJob::Fate::kPending:
        res = httplib::Response();  // a transaction of its own, below
        break;
    }
  }
  if (decided) {
    if (claim->kind == ClaimOutcome::Kind::kInProgress && policy.wait_ms > 0) claim = claims_.Claim(request);
  } else if (tx_handler != nullptr) {
    auto t = store->BeginDeferred();  // BEGIN goes with the claim where the store can
    if (!t.ok()) {
      claim = t.status();
    } else {
      tx = std::move(*t);
      claim = tx->ClaimInTransaction(request);
      if (claim.ok() && claim->kind != ClaimOutcome::Kind::kStarted) tx.reset();  // rolls back
      // Held by a two-phase holder elsewhere: wait for it the two-phase way.
      if (claim.ok() && claim->kind == ClaimOutcome::Kind::kInProgress && policy.wait_ms > 0)
        claim = claims_.Claim(request);
    }
  } else {
    claim = claims_.Claim(request);
  }
  if (!claim.ok()) {
    tx.reset();
    Problem(res, 503, "store-unavailable", "Idempotency store unavailable", claim.status().ToString(), "same-key",
            "1");
    return reject(*key, "store-error");
  }
  switch (claim->kind) {
    case ClaimOutcome::Kind::kCompleted:
      return replay(claim->result);
    case ClaimOutcome::Kind::kConflict:
      Problem(res, 422, "idempotency-key-reused", "Idempotency-Key reused",
              "this key was already used with a different request (method, route or body); use a new key "
              "for a new request",
              "new-key");
      conflicts_.fetch_add(1, std::memory_order_relaxed);
      return say(*key, "conflict");
    case ClaimOutcome::Kind::kInProgress: {
      auto now = claims_.store().NowMs();
      Problem(res, 409, "request-in-progress", "Request in progress",
              "a request with this key is still being processed; retry with the same key after Retry-After",
              "same-key", RetryAfterSeconds(claim->retry_at_ms, now.ok() ? *now : 0));
      in_progress_.fetch_add(1, std::memory_order_relaxed);
      return say(*key, "in-progress");
    }
    case ClaimOutcome::Kind::kStarted:
      break;
  }
  auto under = UnderLimit(scope);
  if (!under.ok() || !*under) {
    if (tx != nullptr) {
      tx.reset();
    } else {
      (void)claims_.Fail(claim->token, FailPolicy::kRelease, "limit");
    }
    if (!under.ok()) {
      Problem(res, 503, "store-unavailable", "Idempotency store unavailable", under.status().ToString(), "same-key",
              "1");
      return reject(*key, "store-error");
    }
    Problem(res, 429, "too-many-keys", "Too many stored idempotency keys",
            "this principal holds " + std::to_string(options_.max_keys_per_principal) +
                " or more stored keys on this route; retry with the same key once older ones expire",
            "same-key", "60");
    return reject(*key, "too-many-keys");
  }
  CountNewKey(scope);

  // Execute, once.
  IDEM_KILL_POINT("http.after_claim");
  Execute(claim->token, res, [&] {
    if (tx_handler != nullptr) {
      (*tx_handler)(req, res, *tx);
    } else {
      handler(req, res);
    }
  });
  executed_.fetch_add(1, std::memory_order_relaxed);

  if (!Kept(policy, res.status)) {
    if (tx != nullptr) {
      tx->Rollback();  // the effect goes with the key
    } else {
      (void)claims_.Fail(claim->token, FailPolicy::kRelease, "status " + std::to_string(res.status));
    }
    return say(*key, "executed-not-stored");
  }
  const StoredResponse stored = StoredOf(res);
  if (tx != nullptr) {
    Status done = tx->CompleteInTransaction(claim->token, Encode(stored), /*is_error=*/res.status >= 500,
                                            claims_.options().retention_ms);
    if (done.ok()) done = tx->Commit();
    if (done.ok()) return say(*key, "executed");
    tx.reset();
    return commit_failed(done);
  }
  IDEM_KILL_POINT("http.before_complete");
  Status done = claims_.Complete(claim->token, Encode(stored));
  if (done.ok()) return say(*key, "executed");
  // The lease ran out and a retry took the key over: its response is the one
  // that counts. Answer with it when it is stored; otherwise ask to retry.
  auto now_claim = claims_.store().FindClaim(scope, *key);
  if (now_claim.ok() && now_claim->has_value() && (*now_claim)->state == ClaimRecord::State::kCompleted &&
      (*now_claim)->fingerprint == fp) {
    res = httplib::Response();
    return replay((*now_claim)->result);
  }
  res = httplib::Response();
  Problem(res, 409, "lease-lost", "Request superseded",
          "this request ran past its lease and another request with the key took over (" + done.message() +
              "); retry with the same key for the stored response",
          "same-key", "1");
  say(*key, "lease-lost");
}

}  // namespace idem::http
