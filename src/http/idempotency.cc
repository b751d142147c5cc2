// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The middleware's request path: Admit (authentication, size, key,
// validation) -> the route's Decide (one strategy per RouteKind:
// TwoPhaseRoute, TransactionalRoute, GroupCommitRoute) -> the answers they
// share (Replay, AnswerUnstarted, Problem, ...).
#include "idem/http/idempotency.h"
#include "idem/http/stored_response.h"

#include "core/kill_point.h"
#include "core/saturating.h"

#include <pthread.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "http/latency.h"
#include "http/parker.h"
#include "idem/message.h"
#include "idem/store.h"

namespace idem::http {
namespace internal {
namespace {
std::atomic<ParkerLookup> g_parker_lookup{nullptr};
}  // namespace
Parker* CurrentParker() {
  ParkerLookup lookup = g_parker_lookup.load(std::memory_order_acquire);
  return lookup != nullptr ? lookup() : nullptr;
}
void SetParkerLookup(ParkerLookup lookup) { g_parker_lookup.store(lookup, std::memory_order_release); }
}  // namespace internal

namespace {

// A client's text in a log line, as one token: as it is when it holds only
// characters that cannot split or fake a field, else in quotes, as
// Printable shows bytes (a backslash and bytes outside printable ASCII as
// \xHH), a quote as \x22: a key "x replayed 201" must not read as an outcome.
std::string LogToken(std::string_view s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    // (strchr finds a NUL too: its terminator.)
    return std::isalnum(static_cast<unsigned char>(c)) || (c != '\0' && std::strchr("-_.:/@+", c) != nullptr);
  });
  if (plain) return std::string(s);
  std::string out = "\"";
  for (char c : Printable(s, s.size())) {
    if (c == '"') {
      out += "\\x22";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The outcomes the request-latency histogram (Idempotency::Metrics) is
// labelled by, and the log's outcome words that map to them; every other
// word is a refusal before the decision ("rejected").
enum LatencyOutcome : size_t {
  kExecuted,
  kReplayed,
  kConflict,
  kInProgress,
  kLeaseLost,
  kNotStored,
  kUnknown,
  kRejected,
  kUnguarded
};
constexpr std::string_view kLatencyOutcomes[] = {"executed",        "replayed",   "conflict",
                                                 "in_progress",     "lease_lost", "executed_not_stored",
                                                 "outcome_unknown", "rejected",   "unguarded"};
size_t LatencyOutcomeOf(std::string_view said) {
  static constexpr std::pair<std::string_view, LatencyOutcome> kSaid[] = {
      {"executed", kExecuted},      {"replayed", kReplayed},    {"conflict", kConflict},
      {"in-progress", kInProgress}, {"lease-lost", kLeaseLost}, {"executed-not-stored", kNotStored},
      {"outcome-unknown", kUnknown}};
  for (const auto& [word, outcome] : kSaid)
    if (word == said) return outcome;
  return kRejected;
}

thread_local const ClaimToken* g_current_claim = nullptr;
// During a two-phase handler: where OutcomeUnknown writes its reason.
thread_local std::optional<std::string>* g_outcome_unknown = nullptr;
// During a two-phase handler: where NotExecuted notes that nothing was done.
thread_local bool* g_not_executed = nullptr;

// Headers that belong to one connection, not to the response: never stored.
bool HopByHop(std::string_view name) {
  static const char* const kSkip[] = {"connection", "keep-alive",          "transfer-encoding",        "content-length",
                                      "date",       "idempotent-replayed", "idempotency-key-retention"};
  return std::any_of(std::begin(kSkip), std::end(kSkip), [&](const char* s) { return EqualsIgnoringCase(name, s); });
}

std::string ScopeOf(const std::string& principal, const std::string& method, const std::string& route) {
  std::string scope = principal + "|" + method + " " + route;
  // A scope is at most 255 bytes: a long principal or route is hashed.
  if (scope.size() > 255) scope = "sha256:" + ToHex(FingerprintOf(scope));
  return scope;
}

std::string RetryAfterSeconds(int64_t retry_at_ms, int64_t now_ms) {
  return std::to_string(std::max<int64_t>(1, (retry_at_ms - now_ms + 999) / 1000));
}

// The stored form of a handler's answer (hop-by-hop headers left out; only
// `kept` ones when it is not empty).
StoredResponse StoredOf(const Answer& ans, const std::vector<std::string>& kept = {}) {
  StoredResponse stored{ans.status, {}, ans.body};
  for (const auto& [k, v] : ans.headers) {
    if (HopByHop(k)) continue;
    if (!kept.empty() && std::none_of(kept.begin(), kept.end(),
                                      [&name = k](const std::string& want) { return EqualsIgnoringCase(name, want); }))
      continue;
    stored.headers.emplace_back(k, v);
  }
  return stored;
}

}  // namespace

const ClaimToken* CurrentClaim() { return g_current_claim; }

void OutcomeUnknown(std::string why) {
  if (g_outcome_unknown != nullptr) *g_outcome_unknown = std::move(why);
}

void NotExecuted() {
  if (g_not_executed != nullptr) *g_not_executed = true;
}

// The middleware's state and steps, out of the header.
struct Idempotency::Impl {
  explicit Impl(const Options& options);
  ~Impl();

  Result<const Route*> AddRoute(std::string name, RouteKind kind, RoutePolicy policy, Store* store);
  void Serve(const Route& route, const Request& request, Answer& answer, const Work& work, const Validator& validate);
  Counters counters() const;
  std::string Metrics() const;

  class TwoPhaseRoute;
  class TransactionalRoute;
  class GroupCommitRoute;
  struct Admitted;
  struct GroupJob;
  class Committer;

  // Admit: the checks before any claim. True: `admitted` is filled and the
  // route decides; false: `answer` is final (a refusal, or the handler ran
  // unguarded).
  bool Admit(const Route& route, const Request& req, Answer& ans, const Work& work, const Validator& validate,
             Admitted& admitted);
  // Answers `status` with the route's refusal (RoutePolicy::refusals, else
  // problem+json); Retry-After when retry_after is not empty.
  void Problem(const RoutePolicy& policy, Answer& ans, int status, std::string_view type, std::string_view title,
               std::string detail, std::string_view retry, const std::string& retry_after = "") const;
  // The answers shared by every route kind.
  void Replay(const Admitted& a, const std::string& stored, Answer& ans);
  // A claim that did not start (or failed): the answer for it. False for a
  // started claim (the route runs it).
  bool AnswerUnstarted(const Admitted& a, const Result<ClaimOutcome>& claim, Answer& ans);
  void StoreUnavailable(const Admitted& a, const Status& why, Answer& ans);
  void CommitFailed(const Admitted& a, const Status& why, Answer& ans);
  // Whether the scope may take one more key; if not, `ans` says why (429,
  // or 503 when the count cannot be read) and the caller releases the key.
  bool AdmitNewKey(const Admitted& a, Answer& ans);
  // Runs the route's handler for a started claim (as CurrentClaim), turning
  // an exception into a 500, and adds the retention header.
  void Execute(const RoutePolicy& policy, const ClaimToken& token, Answer& ans, const std::function<void()>& run);
  // Runs the application's `run` (a handler, a validate); if it throws,
  // `ans` becomes a 500 problem ("<who> threw: ...") and the answer is true.
  bool Threw(const RoutePolicy& policy, std::string_view who, Answer& ans, const std::function<void()>& run);
  // The claim of an admitted request, with the route's bounded wait for a
  // key in progress (RoutePolicy::wait_ms, wait_poll_ms).
  Result<ClaimOutcome> ClaimWaiting(const Admitted& a);
  // Whether the route stores a response with this status.
  static bool Kept(const RoutePolicy& policy, int status);
  // The Idempotency-Key-Retention header's value (seconds).
  std::string Retention() const;
  // Whether the scope may store one more key (429 otherwise).
  Result<bool> UnderLimit(const std::string& scope);
  // One more key stored in the scope by this process (until the next count).
  void CountNewKey(const std::string& scope);
  // One log line (Options::log).
  void Say(const Admitted& a, std::string_view outcome, int status) const;
  void Reject(const Admitted& a, std::string_view outcome, int status);

  // Group commit (Options::group_commit_max): one transaction for a group.
  void RunGroup(Store& store, const std::vector<GroupJob*>& group);
  std::unique_ptr<Committer> committer_;

  Options options_;
  RefusalWriter default_refusals_;  // ProblemJson(options_.problem_base)
  Claims& claims_;
  std::vector<std::unique_ptr<Route>> routes_;
  std::atomic<uint64_t> executed_{0}, replayed_{0}, conflicts_{0}, in_progress_{0}, rejected_{0};
  std::atomic<uint64_t> group_commits_{0}, grouped_requests_{0}, group_reruns_{0}, invalid_{0};
  std::atomic<uint64_t> outcome_unknown_{0}, not_stored_{0};
  std::atomic<uint64_t> waiting_{0};
  http_internal::LatencyByOutcome latency_{kLatencyOutcomes};
  // A principal's stored keys, as last counted in the store plus the keys
  // this process added since. One caller at a time recounts (`counting`):
  // the others answer from the last count meanwhile, so a count that takes
  // long under load is not run by every request that arrives during it.
  struct KeyCount {
    int64_t counted_at_ms = -1;
    int64_t count = 0;
    bool counting = false;
  };
  std::mutex counts_mu_;
  std::map<std::string, KeyCount> counts_;
};

// A request that passed Admit: who, which key, and its claim.
struct Idempotency::Impl::Admitted {
  const Request* req = nullptr;
  const RoutePolicy* policy = nullptr;  // the route's
  std::string key;                      // "-" until the key is read (for the log)
  ClaimRequest claim;
  // What became of it, for the latency histogram (set by Say).
  mutable size_t outcome = kUnguarded;
};

// A route: its name and policy, and how it decides (one subclass per kind).
class Idempotency::Route {
 public:
  using Admitted = Impl::Admitted;
  Route(Impl& owner, std::string name, RoutePolicy policy)
      : owner_(owner), name_(std::move(name)), policy_(std::move(policy)) {}
  virtual ~Route() = default;
  virtual RouteKind kind() const = 0;
  const std::string& name() const { return name_; }
  const RoutePolicy& policy() const { return policy_; }
  // A request the middleware does not guard (a method it leaves alone, a
  // missing key where none is required).
  virtual void Unguarded(const Request& req, Answer& ans, const Work& work) const = 0;
  // An admitted request: claim, run once, store, answer.
  virtual void Decide(const Admitted& a, Answer& ans, const Work& work) const = 0;

 protected:
  Impl& owner_;

 private:
  std::string name_;
  RoutePolicy policy_;
};
// One request of a transactional route on its way through a group.
struct Idempotency::Impl::GroupJob {
  const RoutePolicy* policy = nullptr;
  const Work* work = nullptr;
  const Request* req = nullptr;
  Answer* ans = nullptr;
  ClaimRequest request;
  enum class Fate {
    kPending,
    kDone,          // executed; committed with the group; the answer is in *ans
    kOutcome,       // the key was not started (replay, conflict, in progress): `outcome`
    kAlone,         // run it in a transaction of its own (its response is not kept, or the group failed)
    kCommitFailed,  // the group's commit failed or is in doubt: `error`
  };
  Fate result = Fate::kPending;
  ClaimOutcome outcome;
  Status error;
  std::atomic<bool> decided{false};
  internal::Parker* parker = nullptr;  // a fiber waits for the decision here (see http/parker.h)
};

// Threads that take the queued jobs, as many as Options::group_commit_max,
// and run each group in one transaction (Idempotency::RunGroup).
class Idempotency::Impl::Committer {
 public:
  Committer(Impl& owner, Store& store, int max, int threads) : owner_(owner), store_(store), max_(max) {
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
    job->parker = internal::CurrentParker();
    {
      std::lock_guard lock(mu_);
      queue_.push_back(job);
      queued_.store(queue_.size(), std::memory_order_relaxed);
    }
    cv_.notify_one();
    if (job->parker != nullptr) {
      // Its thread serves other connections meanwhile; the only Unpark of a
      // parked fiber is the committer's, after the decision.
      job->parker->Park();
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
        if (job->parker != nullptr) {
          job->parker->Unpark();
        } else {
          job->decided.notify_one();
        }
      }
      held.clear();
    }
  }

  Impl& owner_;
  Store& store_;
  const int max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GroupJob>> queue_;
  bool stopping_ = false;
  std::atomic<uint64_t> queued_{0};
  std::vector<std::thread> threads_;
};

// One transaction for the whole group: every job's claim (in one call, one
// round trip on PostgreSQL), each started job's handler in turn, their stored
// responses (one call again), then one commit. A job whose response is not
// kept (or that is over its key limit) is taken out and the rest run again
// without it; any store error sends every job of the group to a transaction
// of its own. A key twice in one group: the first job executes it, and the
// later one claims after the completions, so it finds the stored response
// (a replay, after the commit) or a conflict.
void Idempotency::Impl::RunGroup(Store& store, const std::vector<GroupJob*>& group) {
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
      requests.reserve(pass.size());
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
        *j->ans = Answer();
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
        Execute(*j->policy, c.token, *j->ans, [&] { (*j->work)(*j->req, *j->ans, &tx); });
        if (!Kept(*j->policy, j->ans->status)) {
          out = j;
          break;
        }
        started.push_back({j, c.token, Encode(StoredOf(*j->ans, j->policy->stored_headers))});
      }
      if (failed || out != nullptr) break;
      std::vector<Completion> completions;  // pointing into `started`, which no longer grows
      completions.reserve(started.size());
      for (const Started& st : started)
        completions.push_back(Completion{&st.token, st.stored, /*is_error=*/st.job->ans->status >= 500});
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

// kTwoPhase: the claim commits on its own, the handler runs outside any
// transaction, the response is stored after (Claims::Claim, Complete).
class Idempotency::Impl::TwoPhaseRoute final : public Idempotency::Route {
 public:
  using Route::Route;
  RouteKind kind() const override { return RouteKind::kTwoPhase; }

  // A handler that throws is a 500 here too (nothing was claimed).
  void Unguarded(const Request& req, Answer& ans, const Work& work) const override {
    (void)owner_.Threw(policy(), "the handler", ans, [&] { work(req, ans, nullptr); });
  }

  void Decide(const Admitted& a, Answer& ans, const Work& work) const override {
    Impl& o = owner_;
    Result<ClaimOutcome> claim = o.ClaimWaiting(a);
    if (o.AnswerUnstarted(a, claim, ans)) return;
    if (!o.AdmitNewKey(a, ans)) {
      (void)o.claims_.Fail(claim->token, FailPolicy::kRelease, "limit");
      return;
    }
    o.CountNewKey(a.claim.scope);
    if (claim->took_over && policy().takeover == RoutePolicy::Takeover::kOutcomeUnknown)
      return Unknown(a, claim->token, ans,
                     "an earlier request with this key started and its holder's lease ran out before its outcome "
                     "was stored (the process stopped, or the work outran its lease)");

    // Execute, once.
    IDEM_KILL_POINT("http.after_claim");
    std::optional<std::string> unknown;
    bool not_executed = false;
    g_outcome_unknown = &unknown;
    g_not_executed = &not_executed;
    o.Execute(policy(), claim->token, ans, [&] { work(*a.req, ans, nullptr); });
    g_outcome_unknown = nullptr;
    g_not_executed = nullptr;
    o.executed_.fetch_add(1, std::memory_order_relaxed);
    if (unknown) {
      if (policy().takeover == RoutePolicy::Takeover::kOutcomeUnknown) return Unknown(a, claim->token, ans, *unknown);
      (void)o.claims_.Fail(claim->token, FailPolicy::kRelease, "outcome unknown");
      ans = Answer();
      o.outcome_unknown_.fetch_add(1, std::memory_order_relaxed);
      o.Problem(policy(), ans, 503, "outcome-unknown", "Outcome unknown",
                *unknown + "; the key is free again: retry with the same key (the service behind honours it)",
                "same-key", "1");
      return o.Say(a, "outcome-unknown", ans.status);
    }
    if (not_executed || !Kept(policy(), ans.status)) {
      (void)o.claims_.Fail(claim->token, FailPolicy::kRelease, "status " + std::to_string(ans.status));
      return o.Say(a, "executed-not-stored", ans.status);
    }
    std::string stored;
    if (policy().max_stored_body > 0 && ans.body.size() > policy().max_stored_body) {
      // The first answer goes out whole; repeats get a problem instead.
      Answer instead;
      o.Problem(policy(), instead, 410, "response-not-stored", "Response not stored",
                "the request with this key ran (status " + std::to_string(ans.status) + "); its " +
                    std::to_string(ans.body.size()) + "-byte response was over the " +
                    std::to_string(policy().max_stored_body) +
                    "-byte bound and was not kept. It does not run again: read the result from the service, or send "
                    "a new key for a new request",
                "no");
      stored = Encode(StoredOf(instead));
      o.not_stored_.fetch_add(1, std::memory_order_relaxed);
    } else {
      stored = Encode(StoredOf(ans, policy().stored_headers));
    }
    IDEM_KILL_POINT("http.before_complete");
    Status done = o.claims_.Complete(claim->token, stored);
    if (done.ok()) return o.Say(a, "executed", ans.status);
    LeaseLost(a, done, ans);
  }

 private:
  // The lease ran out and a retry took the key over: its response is the
  // one that counts. Answer with it when it is stored; otherwise ask to
  // retry.
  void LeaseLost(const Admitted& a, const Status& done, Answer& ans) const {
    Impl& o = owner_;
    ans = Answer();
    auto now_claim = o.claims_.store().FindClaim(a.claim.scope, a.claim.key);
    if (now_claim.ok() && now_claim->has_value() && (*now_claim)->state == ClaimRecord::State::kCompleted &&
        (*now_claim)->fingerprint == a.claim.fingerprint)
      return o.Replay(a, (*now_claim)->result, ans);
    o.Problem(policy(), ans, 409, "lease-lost", "Request superseded",
              "this request ran past its lease and another request with the key took over (" + done.message() +
                  "); retry with the same key for the stored response",
              "same-key", "1");
    o.Say(a, "lease-lost", ans.status);
  }

  // The key's outcome is unknown and must stay so: completed (fenced by
  // `token`) with the outcome-unknown problem, which is this answer and
  // every repeat's.
  void Unknown(const Admitted& a, const ClaimToken& token, Answer& ans, const std::string& why) const {
    Impl& o = owner_;
    ans = Answer();
    o.Problem(policy(), ans, 503, "outcome-unknown", "Outcome unknown",
              "a request with Idempotency-Key " + a.key + " was sent on but its outcome is unknown: " + why +
                  ". It is never sent again with this key. Check with the service whether it took effect; only if "
                  "it did not, send the request again with a new key",
              "no");
    o.outcome_unknown_.fetch_add(1, std::memory_order_relaxed);
    Status done = o.claims_.Complete(token, Encode(StoredOf(ans)));
    if (done.ok()) return o.Say(a, "outcome-unknown", ans.status);
    LeaseLost(a, done, ans);
  }
};

// kTransactional: the claim, the handler's writes and the stored response in
// one transaction of `store` (ClaimInTransaction, CompleteInTransaction).
class Idempotency::Impl::TransactionalRoute : public Idempotency::Route {
 public:
  TransactionalRoute(Impl& owner, std::string name, RoutePolicy policy, Store& store)
      : Route(owner, std::move(name), std::move(policy)), store_(store) {}
  RouteKind kind() const override { return RouteKind::kTransactional; }

  void Unguarded(const Request& req, Answer& ans, const Work& work) const override {
    auto t = store_.BeginDeferred();
    if (!t.ok())
      return owner_.Problem(policy(), ans, 503, "store-unavailable", "Store unavailable", t.status().ToString(),
                            "same-key");
    // A handler that throws is a 500, its transaction rolled back.
    if (owner_.Threw(policy(), "the handler", ans, [&] { work(req, ans, t->get()); })) return;
    if (ans.status < 400) {
      if (Status c = (*t)->Commit(); !c.ok())
        owner_.Problem(policy(), ans, 503, "store-unavailable", "Commit failed", c.ToString(), "same-key");
    }
  }

  void Decide(const Admitted& a, Answer& ans, const Work& work) const override {
    // One read answers replays, conflicts and keys in progress without a
    // transaction; only a key to start opens one.
    if (std::optional<ClaimOutcome> peeked = Peek(a)) return Decided(a, std::move(*peeked), ans, work);
    Alone(a, ans, work);
  }

 protected:
  std::optional<ClaimOutcome> Peek(const Admitted& a) const {
    auto peek = owner_.claims_.store().Peek(a.claim);
    if (peek.ok() && peek->has_value()) return std::move(**peek);
    return std::nullopt;
  }

  // A key another request holds or finished (a peek's answer, or a group's):
  // waited for the two-phase way when the route waits, then answered.
  void Decided(const Admitted& a, ClaimOutcome outcome, Answer& ans, const Work& work) const {
    Result<ClaimOutcome> claim = std::move(outcome);
    if (claim->kind == ClaimOutcome::Kind::kStarted) return Alone(a, ans, work);  // not from a peek; be safe
    if (claim->kind == ClaimOutcome::Kind::kInProgress && policy().wait_ms > 0) claim = WaitTwoPhase(a);
    (void)owner_.AnswerUnstarted(a, claim, ans);
  }

  // The request in a transaction of its own: BEGIN with the claim, the
  // handler, the stored response, one commit.
  void Alone(const Admitted& a, Answer& ans, const Work& work) const {
    Impl& o = owner_;
    std::unique_ptr<StoreTransaction> tx;
    Result<ClaimOutcome> claim = Status::Internal("not claimed");
    auto t = store_.BeginDeferred();  // BEGIN goes with the claim where the store can
    if (!t.ok()) {
      claim = t.status();
    } else {
      tx = std::move(*t);
      claim = tx->ClaimInTransaction(a.claim);
      if (claim.ok() && claim->kind != ClaimOutcome::Kind::kStarted) tx.reset();  // rolls back
      // Held by a two-phase holder elsewhere: wait for it the two-phase way.
      if (claim.ok() && claim->kind == ClaimOutcome::Kind::kInProgress && policy().wait_ms > 0) claim = WaitTwoPhase(a);
    }
    if (!claim.ok()) tx.reset();
    if (o.AnswerUnstarted(a, claim, ans)) return;
    if (!o.AdmitNewKey(a, ans)) return;  // tx rolls back with the key
    o.CountNewKey(a.claim.scope);

    // Execute, once.
    IDEM_KILL_POINT("http.after_claim");
    o.Execute(policy(), claim->token, ans, [&] { work(*a.req, ans, tx.get()); });
    o.executed_.fetch_add(1, std::memory_order_relaxed);
    if (!Kept(policy(), ans.status)) {
      tx->Rollback();  // the effect goes with the key
      return o.Say(a, "executed-not-stored", ans.status);
    }
    Status done = tx->CompleteInTransaction(claim->token, Encode(StoredOf(ans, policy().stored_headers)),
                                            /*is_error=*/ans.status >= 500, o.claims_.options().retention_ms);
    if (done.ok()) done = tx->Commit();
    if (done.ok()) return o.Say(a, "executed", ans.status);
    tx.reset();
    o.CommitFailed(a, done, ans);
  }

  // Claims::Claim's bounded wait for a key in progress. It answers kStarted
  // when the holder let the key go meanwhile; this route cannot run a
  // handler outside its transaction, so the key is let go again and the
  // client asked to retry (409 with Retry-After).
  Result<ClaimOutcome> WaitTwoPhase(const Admitted& a) const {
    Result<ClaimOutcome> claim = owner_.ClaimWaiting(a);
    if (claim.ok() && claim->kind == ClaimOutcome::Kind::kStarted) {
      (void)owner_.claims_.Fail(claim->token, FailPolicy::kRelease, "transactional route");
      ClaimOutcome retry;
      retry.kind = ClaimOutcome::Kind::kInProgress;
      auto now = owner_.claims_.store().NowMs();
      retry.retry_at_ms = now.ok() ? *now : 0;
      return retry;
    }
    return claim;
  }

  Store& store_;
};

// kTransactional with group commit (Options::group_commit_max > 1): a key to
// start is queued for the committer's next group; what the group cannot
// carry runs alone, as TransactionalRoute does.
class Idempotency::Impl::GroupCommitRoute final : public Idempotency::Impl::TransactionalRoute {
 public:
  using TransactionalRoute::TransactionalRoute;

  void Decide(const Admitted& a, Answer& ans, const Work& work) const override {
    if (std::optional<ClaimOutcome> peeked = Peek(a)) return Decided(a, std::move(*peeked), ans, work);
    Impl& o = owner_;
    auto job = std::make_shared<GroupJob>();
    job->policy = &policy();
    job->work = &work;
    job->req = a.req;
    job->ans = &ans;
    job->request = a.claim;
    o.committer_->Run(job);
    switch (job->result) {
      case GroupJob::Fate::kDone:
        o.executed_.fetch_add(1, std::memory_order_relaxed);
        o.CountNewKey(a.claim.scope);
        return o.Say(a, "executed", ans.status);
      case GroupJob::Fate::kCommitFailed: return o.CommitFailed(a, job->error, ans);
      case GroupJob::Fate::kOutcome: return Decided(a, std::move(job->outcome), ans, work);
      case GroupJob::Fate::kAlone:
      case GroupJob::Fate::kPending:
        ans = Answer();  // a transaction of its own
        return Alone(a, ans, work);
    }
  }
};

Idempotency::Idempotency(const Options& options) : impl_(std::make_unique<Impl>(options)) {}

Idempotency::Impl::Impl(const Options& options)
    : options_(options), default_refusals_(ProblemJson(options.problem_base)), claims_(*options.claims) {
  if (options_.env == nullptr) options_.env = Env::Default();
}

Result<std::unique_ptr<Idempotency>> Idempotency::Open(const Options& options) {
  // Set-up mistakes fail at start-up, not as a 5xx on every request (Claims
  // are valid by construction: Claims::Open checks their options).
  if (options.claims == nullptr) return Status::InvalidArgument("Idempotency::Options::claims is null");
  if (!options.authenticate) return Status::InvalidArgument("Idempotency::Options::authenticate is empty");
  if (options.max_keys_per_principal < 0)
    return Status::InvalidArgument("Idempotency::Options::max_keys_per_principal must be >= 0 (0: no limit), got " +
                                   std::to_string(options.max_keys_per_principal));
  if (options.group_commit_max < 0)
    return Status::InvalidArgument("Idempotency::Options::group_commit_max cannot be negative, got " +
                                   std::to_string(options.group_commit_max));
  if (options.group_committers < 1)
    return Status::InvalidArgument("Idempotency::Options::group_committers must be >= 1, got " +
                                   std::to_string(options.group_committers));
  return std::unique_ptr<Idempotency>(new Idempotency(options));
}

Idempotency::~Idempotency() = default;

Idempotency::Impl::~Impl() { committer_.reset(); }  // its threads first: they use the rest

Result<const Idempotency::Route*> Idempotency::AddRoute(std::string name, RouteKind kind, RoutePolicy policy,
                                                        Store* store) {
  return impl_->AddRoute(std::move(name), kind, std::move(policy), store);
}

void Idempotency::Serve(const Route& route, const Request& req, Answer& ans, const Work& work,
                        const Validator& validate) {
  impl_->Serve(route, req, ans, work, validate);
}

Idempotency::Counters Idempotency::counters() const { return impl_->counters(); }
std::string Idempotency::Metrics() const { return impl_->Metrics(); }

Result<const Idempotency::Route*> Idempotency::Impl::AddRoute(std::string name, RouteKind kind, RoutePolicy policy,
                                                              Store* store) {
  if (name.empty()) return Status::InvalidArgument("Idempotency: the route name is empty (it scopes the keys)");
  const std::string where = "Idempotency route " + name + ": ";
  if (policy.lease_ms <= 0)
    return Status::InvalidArgument(where + "RoutePolicy::lease_ms must be > 0, got " + std::to_string(policy.lease_ms));
  if (policy.wait_ms < 0)
    return Status::InvalidArgument(where + "RoutePolicy::wait_ms cannot be negative, got " +
                                   std::to_string(policy.wait_ms));
  if (policy.wait_poll_ms < 0)
    return Status::InvalidArgument(where + "RoutePolicy::wait_poll_ms cannot be negative, got " +
                                   std::to_string(policy.wait_poll_ms));
  std::unique_ptr<Route> route;
  switch (kind) {
    case RouteKind::kTwoPhase:
      if (store != nullptr) return Status::InvalidArgument(where + "a two-phase route takes no store");
      route = std::make_unique<TwoPhaseRoute>(*this, std::move(name), std::move(policy));
      break;
    case RouteKind::kTransactional:
      if (store == nullptr || store->claim_store() != &claims_.store())
        return Status::InvalidArgument(where +
                                       "a transactional route needs the store the Claims keep their records in");
      if (options_.group_commit_max > 1) {
        if (committer_ == nullptr)
          committer_ = std::make_unique<Committer>(*this, *store, options_.group_commit_max, options_.group_committers);
        route = std::make_unique<GroupCommitRoute>(*this, std::move(name), std::move(policy), *store);
      } else {
        route = std::make_unique<TransactionalRoute>(*this, std::move(name), std::move(policy), *store);
      }
      break;
  }
  routes_.push_back(std::move(route));
  return routes_.back().get();
}

Result<Handler> Idempotency::Wrap(std::string route, RoutePolicy policy, Handler handler) {
  IDEM_ASSIGN_OR_RETURN(const Route* r, AddRoute(std::move(route), RouteKind::kTwoPhase, std::move(policy)));
  return Handler([this, r, work = Work([handler = std::move(handler)](const Request& req, Answer& ans, Transaction*) {
                             handler(req, ans);
                           })](const Request& req, Answer& ans) { Serve(*r, req, ans, work); });
}

Result<Handler> Idempotency::WrapInTransaction(std::string route, RoutePolicy policy, Store& store, TxHandler handler) {
  IDEM_ASSIGN_OR_RETURN(const Route* r,
                        AddRoute(std::move(route), RouteKind::kTransactional, std::move(policy), &store));
  return Handler(
      [this, r, work = Work([handler = std::move(handler)](const Request& req, Answer& ans, Transaction* tx) {
                  handler(req, ans, *tx);
                })](const Request& req, Answer& ans) { Serve(*r, req, ans, work); });
}

void Idempotency::Impl::Serve(const Route& route, const Request& req, Answer& ans, const Work& work,
                              const Validator& validate) {
  const auto start = std::chrono::steady_clock::now();
  Admitted a;
  if (!route.policy().methods.count(req.method)) {
    route.Unguarded(req, ans, work);
  } else if (Admit(route, req, ans, work, validate, a)) {
    route.Decide(a, ans, work);
  }
  latency_.AddSince(a.outcome, start);
}

bool Idempotency::Impl::Admit(const Route& route, const Request& req, Answer& ans, const Work& work,
                              const Validator& validate, Admitted& a) {
  const RoutePolicy& policy = route.policy();
  a.req = &req;
  a.policy = &policy;
  a.key = "-";
  std::optional<std::string> principal = options_.authenticate(req);
  if (!principal) {
    Problem(policy, ans, 401, "unauthenticated", "Unauthenticated", "send Authorization: Bearer <API key>", "no");
    Reject(a, "unauthenticated", ans.status);
    return false;
  }
  if (req.body.size() > options_.max_body_bytes) {
    Problem(
        policy, ans, 413, "body-too-large", "Request body too large",
        "the body is " + std::to_string(req.body.size()) + " bytes; at most " + std::to_string(options_.max_body_bytes),
        "new-key");
    Reject(a, "too-large", ans.status);
    return false;
  }
  const size_t keys = req.headers.Count("Idempotency-Key");
  if (keys == 0) {
    if (!policy.require_key) {
      route.Unguarded(req, ans, work);
      return false;
    }
    Problem(
        policy, ans, 400, "idempotency-key-missing", "Idempotency-Key missing",
        "this endpoint requires an Idempotency-Key header (1 to 255 characters: a quoted string, or a token such as "
        "a UUID)",
        "new-key");
    Reject(a, "missing-key", ans.status);
    return false;
  }
  if (keys > 1) {
    Problem(policy, ans, 400, "idempotency-key-malformed", "Idempotency-Key malformed",
            "send exactly one Idempotency-Key header", "new-key");
    Reject(a, "malformed-key", ans.status);
    return false;
  }
  Result<std::string> key = ParseKey(req.headers.Get("Idempotency-Key"));
  if (!key.ok()) {
    Problem(policy, ans, 400, "idempotency-key-malformed", "Idempotency-Key malformed", key.status().message(),
            "new-key");
    Reject(a, "malformed-key", ans.status);
    return false;
  }
  a.key = *key;
  if (const Validator& check = validate ? validate : policy.validate; check) {
    bool valid = false;
    (void)Threw(policy, "validate", ans, [&] { valid = check(req, ans); });
    if (!valid) {
      if (ans.status < 400) {  // refused without saying why
        ans = Answer();
        Problem(policy, ans, 400, "invalid-request", "Invalid request",
                "the request was refused before it ran; correct it and send it again, with the same key if you like",
                "same-key");
      }
      invalid_.fetch_add(1, std::memory_order_relaxed);
      Reject(a, "invalid", ans.status);
      return false;
    }
  }
  const bool target = policy.fingerprint_target;
  a.claim = ClaimRequest{
      .scope = target ? ScopeOf(*principal, "*", route.name()) : ScopeOf(*principal, req.method, route.name()),
      .key = *key,
      .fingerprint = RequestFingerprint(req.method, target ? route.name() + " " + req.path : route.name(), req.body,
                                        req.headers.Get("Content-Type")),
      .lease_ms = policy.lease_ms,
      .wait_ms = policy.wait_ms};
  return true;
}

void Idempotency::Impl::Replay(const Admitted& a, const std::string& stored, Answer& ans) {
  auto r = Decode(stored);
  if (!r.ok()) {
    Problem(*a.policy, ans, 500, "stored-response-corrupt", "Stored response unreadable", r.status().ToString(), "no");
    return Reject(a, "corrupt", ans.status);
  }
  ans.status = r->status;
  for (auto& [k, v] : r->headers) ans.headers.Add(std::move(k), std::move(v));
  ans.body = std::move(r->body);
  ans.headers.Set("Idempotent-Replayed", "true");
  ans.headers.Set("Idempotency-Key-Retention", Retention());
  replayed_.fetch_add(1, std::memory_order_relaxed);
  Say(a, "replayed", ans.status);
}

bool Idempotency::Impl::AnswerUnstarted(const Admitted& a, const Result<ClaimOutcome>& claim, Answer& ans) {
  if (!claim.ok()) {
    StoreUnavailable(a, claim.status(), ans);
    return true;
  }
  switch (claim->kind) {
    case ClaimOutcome::Kind::kStarted: return false;
    case ClaimOutcome::Kind::kCompleted: Replay(a, claim->result, ans); return true;
    case ClaimOutcome::Kind::kConflict:
      Problem(*a.policy, ans, 422, "idempotency-key-reused", "Idempotency-Key reused",
              "this key was already used with a different request (method, route or body); use a new key "
              "for a new request",
              "new-key");
      conflicts_.fetch_add(1, std::memory_order_relaxed);
      Say(a, "conflict", ans.status);
      return true;
    case ClaimOutcome::Kind::kInProgress: {
      auto now = claims_.store().NowMs();
      Problem(*a.policy, ans, 409, "request-in-progress", "Request in progress",
              "a request with this key is still being processed; retry with the same key after Retry-After", "same-key",
              RetryAfterSeconds(claim->retry_at_ms, now.ok() ? *now : 0));
      in_progress_.fetch_add(1, std::memory_order_relaxed);
      Say(a, "in-progress", ans.status);
      return true;
    }
  }
  return false;
}

void Idempotency::Impl::StoreUnavailable(const Admitted& a, const Status& why, Answer& ans) {
  Problem(*a.policy, ans, 503, "store-unavailable", "Idempotency store unavailable", why.ToString(), "same-key", "1");
  Reject(a, "store-error", ans.status);
}

// Nothing committed or everything (in doubt): a retry with the key gets
// either a fresh execution or the replay, never a second effect.
void Idempotency::Impl::CommitFailed(const Admitted& a, const Status& why, Answer& ans) {
  ans = Answer();
  Problem(*a.policy, ans, 503, "commit-failed", "Commit failed",
          "the request's effect and stored response could not be committed (" + why.ToString() +
              "); retry with the same key",
          "same-key", "1");
  Reject(a, "commit-failed", ans.status);
}

bool Idempotency::Impl::AdmitNewKey(const Admitted& a, Answer& ans) {
  auto under = UnderLimit(a.claim.scope);
  if (under.ok() && *under) return true;
  if (!under.ok()) {
    StoreUnavailable(a, under.status(), ans);
    return false;
  }
  Problem(*a.policy, ans, 429, "too-many-keys", "Too many stored idempotency keys",
          "this principal holds " + std::to_string(options_.max_keys_per_principal) +
              " or more stored keys on this route; retry with the same key once older ones expire",
          "same-key", "60");
  Reject(a, "too-many-keys", ans.status);
  return false;
}

bool Idempotency::Impl::Threw(const RoutePolicy& policy, std::string_view who, Answer& ans,
                              const std::function<void()>& run) {
  std::string what;
  try {
    run();
    return false;
  } catch (const std::exception& e) {
    what = std::string(who) + " threw: " + e.what();
  } catch (...) {
    what = std::string(who) + " threw";
  }
  ans = Answer();
  Problem(policy, ans, 500, "handler-failed", "Internal error", what, "same-key");
  return true;
}

// Without wait_poll_ms, Claims::Claim's wait (the store's watch). With it:
// this process's wakeup (the default watch, woken by a Complete or Release
// made here), else a Peek every wait_poll_ms, and a claim again once the key
// is no longer held; no connection is kept between the reads.
Result<ClaimOutcome> Idempotency::Impl::ClaimWaiting(const Admitted& a) {
  const RoutePolicy& policy = *a.policy;
  if (policy.wait_ms == 0 || policy.wait_poll_ms == 0) return claims_.Claim(a.claim);
  ClaimRequest once = a.claim;
  once.wait_ms = 0;
  Env* env = claims_.options().env;
  const int64_t deadline = idem::internal::SaturatingAdd(env->NowMs(), policy.wait_ms);
  // Taken before the first read: a completion right after it wakes the wait.
  std::unique_ptr<ClaimStore::Watch> watch = claims_.store().ClaimStore::WatchKey(once.scope, once.key);
  Result<ClaimOutcome> claim = claims_.Claim(once);
  if (!claim.ok() || claim->kind != ClaimOutcome::Kind::kInProgress) return claim;
  waiting_.fetch_add(1, std::memory_order_relaxed);
  for (;;) {
    const int64_t left = deadline - env->NowMs();
    if (left <= 0) break;
    watch->Wait(std::min(left, policy.wait_poll_ms));
    Result<std::optional<ClaimOutcome>> peek = claims_.store().Peek(once);
    if (peek.ok() && peek->has_value() && (**peek).kind == ClaimOutcome::Kind::kInProgress) continue;
    claim = claims_.Claim(once);
    if (!claim.ok() || claim->kind != ClaimOutcome::Kind::kInProgress) break;
  }
  waiting_.fetch_sub(1, std::memory_order_relaxed);
  return claim;
}

bool Idempotency::Impl::Kept(const RoutePolicy& policy, int status) {
  return (status < 400) || (status >= 500 && policy.store_5xx) ||
         (status >= 400 && status < 500 && policy.stored_4xx.count(status));
}

void Idempotency::Impl::Execute(const RoutePolicy& policy, const ClaimToken& token, Answer& ans,
                                const std::function<void()>& run) {
  g_current_claim = &token;
  (void)Threw(policy, "the handler", ans, run);
  g_current_claim = nullptr;
  ans.headers.Set("Idempotency-Key-Retention", Retention());
}

Idempotency::Counters Idempotency::Impl::counters() const {
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
  c.outcome_unknown = outcome_unknown_.load();
  c.not_stored = not_stored_.load();
  c.waiting = waiting_.load();
  return c;
}

std::string Idempotency::Impl::Metrics() const {
  using http_internal::AppendMetric;
  const Counters c = counters();
  std::string out;
  AppendMetric(out, "idem_http_executed_total", "Requests whose handler ran (first executions).", "counter",
               c.executed);
  AppendMetric(out, "idem_http_replayed_total", "Requests answered with a stored response.", "counter", c.replayed);
  AppendMetric(out, "idem_http_conflicts_total", "Requests refused 422: the key was used for another request.",
               "counter", c.conflicts);
  AppendMetric(out, "idem_http_in_progress_total", "Requests refused 409: the key's first request still ran.",
               "counter", c.in_progress);
  AppendMetric(out, "idem_http_rejected_total", "Requests refused before running (401, 400, 413, 429, 503).", "counter",
               c.rejected);
  AppendMetric(out, "idem_http_group_commits_total", "Transactions committed for groups of requests.", "counter",
               c.group_commits);
  AppendMetric(out, "idem_http_grouped_requests_total", "Requests committed in those groups.", "counter",
               c.grouped_requests);
  AppendMetric(out, "idem_http_group_queue", "Requests waiting for the next group now.", "gauge", c.group_queue);
  AppendMetric(out, "idem_http_group_reruns_total",
               "Groups rolled back and run again without a request whose response was not to be stored.", "counter",
               c.group_reruns);
  AppendMetric(out, "idem_http_invalid_total", "Requests refused by the route's validation before any claim.",
               "counter", c.invalid);
  latency_.Write(out, "idem_http_request_seconds", "Time from a request's arrival to its answer, by outcome.");
  return out;
}

void Idempotency::Impl::Problem(const RoutePolicy& policy, Answer& ans, int status, std::string_view type,
                                std::string_view title, std::string detail, std::string_view retry,
                                const std::string& retry_after) const {
  ans.status = status;
  ans.headers.Set("Idempotency-Key-Retention", Retention());
  if (!retry_after.empty()) ans.headers.Set("Retry-After", retry_after);
  const Refusal refusal{.status = status, .type = type, .title = title, .detail = std::move(detail), .retry = retry};
  if (policy.refusals)
    policy.refusals(refusal, ans);
  else
    default_refusals_(refusal, ans);
}

std::string Idempotency::Impl::Retention() const { return std::to_string(claims_.options().retention_ms / 1000); }

void Idempotency::Impl::Say(const Admitted& a, std::string_view outcome, int status) const {
  a.outcome = LatencyOutcomeOf(outcome);
  if (options_.log)
    options_.log(LogToken(a.req->method) + " " + LogToken(a.req->path) + " key=" + LogToken(a.key) + " " +
                 std::string(outcome) + " " + std::to_string(status));
  if (options_.observer == nullptr) return;
  static constexpr std::pair<std::string_view, EventKind> kKinds[] = {
      {"executed", EventKind::kClaimCompleted}, {"replayed", EventKind::kClaimReplayed},
      {"conflict", EventKind::kClaimConflict},  {"in-progress", EventKind::kClaimInProgress},
      {"lease-lost", EventKind::kClaimFenced},  {"executed-not-stored", EventKind::kClaimReleased}};
  Event e;
  e.consumer = a.claim.scope;
  e.message_id = a.key;
  const std::string detail = std::string(outcome) + " " + std::to_string(status);
  e.detail = detail;
  e.at_ms = options_.env->NowMs();
  for (const auto& [name, kind] : kKinds) {
    if (name != outcome) continue;
    if (kind == EventKind::kClaimCompleted || kind == EventKind::kClaimReleased) {
      e.kind = EventKind::kClaimStarted;  // it ran: the key was this request's
      options_.observer->OnEvent(e);
    }
    e.kind = kind;
    options_.observer->OnEvent(e);
  }
}

void Idempotency::Impl::Reject(const Admitted& a, std::string_view outcome, int status) {
  rejected_.fetch_add(1, std::memory_order_relaxed);
  Say(a, outcome, status);
}

void Idempotency::Impl::CountNewKey(const std::string& scope) {
  if (options_.max_keys_per_principal == 0) return;  // no limit: nothing counted
  std::lock_guard lock(counts_mu_);
  ++counts_[scope].count;
}

Result<bool> Idempotency::Impl::UnderLimit(const std::string& scope) {
  if (options_.max_keys_per_principal == 0) return true;  // no limit: nothing counted
  const int64_t now = options_.env->NowMs();
  {
    std::lock_guard lock(counts_mu_);
    KeyCount& c = counts_[scope];
    const bool fresh = c.counted_at_ms >= 0 && now - c.counted_at_ms < 1000;
    if (fresh || (c.counting && c.counted_at_ms >= 0)) return c.count < options_.max_keys_per_principal;
    c.counting = true;
  }
  Result<int64_t> n = claims_.store().CountClaims(scope);
  std::lock_guard lock(counts_mu_);
  KeyCount& c = counts_[scope];
  c.counting = false;
  if (!n.ok()) return n.status();
  // The count includes this request's own claim (taken before the check,
  // added by the caller once allowed): the others are n - 1.
  c = KeyCount{now, std::max<int64_t>(0, *n - 1)};
  // Principals seen once are not kept for ever: past 10,000, the counts
  // of the others go (each is counted again when it comes back).
  if (counts_.size() > 10'000) {
    for (auto it = counts_.begin(); it != counts_.end();)
      it = it->first != scope && !it->second.counting ? counts_.erase(it) : std::next(it);
  }
  return c.count < options_.max_keys_per_principal;
}

}  // namespace idem::http
