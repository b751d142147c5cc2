// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The harness: a clean run, then each scenario on a fresh store, compared
// state against state. The crash points are reached through FaultyStore (a
// Store that forwards to the run's real one and stops where the Inbox's
// kill points are) and through the delivery wrapper, so they need no kill
// points compiled into idem.
#include "idem/testing/harness.h"
#include "idem/store_backend.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "idem/open.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/throwaway.h"
#include "idem/url.h"

namespace idem::testing {

Message Msg(std::string id, std::string payload) {
  Message m;
  m.id = std::move(id);
  m.payload = std::move(payload);
  return m;
}

std::vector<Scenario> AllScenarios() {
  return {Scenario::kTwice,      Scenario::kInterleaved, Scenario::kRace,
          Scenario::kConcurrent, Scenario::kProcesses,   Scenario::kCrash,
          Scenario::kInDoubt,    Scenario::kLeaseExpiry, Scenario::kLostResponse};
}

std::string_view ScenarioName(Scenario s) {
  switch (s) {
    case Scenario::kTwice: return "twice";
    case Scenario::kInterleaved: return "interleaved";
    case Scenario::kRace: return "race";
    case Scenario::kConcurrent: return "concurrent";
    case Scenario::kProcesses: return "processes";
    case Scenario::kCrash: return "crash";
    case Scenario::kInDoubt: return "in_doubt";
    case Scenario::kLeaseExpiry: return "lease_expiry";
    case Scenario::kLostResponse: return "lost_response";
  }
  return "?";
}

namespace {

// The crash points, in the order a delivery passes them.
constexpr const char* kBeforeMarker = "inbox.before_marker";
constexpr const char* kAfterMarker = "inbox.after_marker";
constexpr const char* kAfterWork = "inbox.after_work";
constexpr const char* kCommitDone = "store.commit_done";
constexpr const char* kAfterCommit = "inbox.after_commit";
constexpr const char* kAfterCall = "downstream.after_call";

// What the run's store does on purpose, shared by the threads of a process.
struct Plan {
  // In a child: SIGKILL on reaching this point.
  std::string kill_at;
  // The next commit: 1 rolls back, 2 commits; either is reported in doubt.
  std::atomic<int> in_doubt{0};
  // Two threads meet before each commit (a short wait if the other never
  // comes: it may be waiting for this one's locks).
  std::atomic<bool> rendezvous{false};
  // Run once, right after the next Begin.
  std::mutex mu;
  std::function<void()> on_begin;

  std::mutex rmu;
  std::condition_variable rcv;
  int waiting = 0;
  uint64_t generation = 0;

  void Hit(std::string_view point) {
    if (!kill_at.empty() && kill_at == point) {
      std::fflush(nullptr);
      ::kill(::getpid(), SIGKILL);
    }
  }
  void Rendezvous() {
    std::unique_lock<std::mutex> l(rmu);
    const uint64_t g = generation;
    if (++waiting >= 2) {
      waiting = 0;
      ++generation;
      rcv.notify_all();
      return;
    }
    if (!rcv.wait_for(l, std::chrono::milliseconds(100), [&] { return generation != g; })) waiting--;
  }
  std::function<void()> TakeOnBegin() {
    std::lock_guard<std::mutex> l(mu);
    return std::exchange(on_begin, nullptr);
  }
};

class FaultyTx final : public StoreTransaction {
 public:
  FaultyTx(std::unique_ptr<StoreTransaction> inner, Plan& plan) : inner_(std::move(inner)), plan_(plan) {}
  Result<int64_t> Exec(std::string_view sql, std::span<const Value> params) override {
    return inner_->Exec(sql, params);
  }
  Result<Rows> Query(std::string_view sql, std::span<const Value> params) override {
    return inner_->Query(sql, params);
  }
  void* NativeHandle() override { return inner_->NativeHandle(); }
  Result<std::optional<Fingerprint>> InsertMarker(const Marker& marker) override {
    auto r = inner_->InsertMarker(marker);
    plan_.Hit(kAfterMarker);
    return r;
  }
  Result<std::vector<std::optional<Fingerprint>>> InsertMarkers(std::span<const Marker> markers) override {
    auto r = inner_->InsertMarkers(markers);
    plan_.Hit(kAfterMarker);
    return r;
  }
  Status PutDeadLetter(const DeadLetter& letter) override { return inner_->PutDeadLetter(letter); }
  OutboxStore* outbox() override { return inner_->outbox(); }
  Status AddToOutbox(std::vector<OutboxRow> rows) override { return inner_->AddToOutbox(std::move(rows)); }
  bool Healthy() const override { return inner_->Healthy(); }
  Result<ClaimOutcome> ClaimInTransaction(const ClaimRequest& request) override {
    return inner_->ClaimInTransaction(request);
  }
  Status CompleteInTransaction(const ClaimToken& token, std::string_view result, bool is_error,
                               int64_t retention_ms) override {
    return inner_->CompleteInTransaction(token, result, is_error, retention_ms);
  }
  std::vector<Result<ClaimOutcome>> ClaimManyInTransaction(std::span<const ClaimRequest> requests) override {
    return inner_->ClaimManyInTransaction(requests);
  }
  std::vector<Status> CompleteManyInTransaction(std::span<const Completion> completions,
                                                int64_t retention_ms) override {
    return inner_->CompleteManyInTransaction(completions, retention_ms);
  }
  Status Commit() override {
    plan_.Hit(kAfterWork);
    if (plan_.rendezvous.load()) plan_.Rendezvous();
    switch (plan_.in_doubt.exchange(0)) {
      case 1:
        inner_->Rollback();
        return Status::InDoubt("idem::testing: the commit was rolled back and reported in doubt (scenario in_doubt)");
      case 2: {
        Status s = inner_->Commit();
        if (!s.ok()) return s;
        return Status::InDoubt("idem::testing: the commit happened and was reported in doubt (scenario in_doubt)");
      }
      default: break;
    }
    Status s = inner_->Commit();
    if (s.ok()) plan_.Hit(kCommitDone);
    return s;
  }
  void Rollback() noexcept override { inner_->Rollback(); }

 private:
  std::unique_ptr<StoreTransaction> inner_;
  Plan& plan_;
};

class FaultyStore final : public Store {
 public:
  FaultyStore(Store& inner, Plan& plan) : inner_(inner), plan_(plan) {}
  Result<std::unique_ptr<StoreTransaction>> Begin() override { return Wrap(inner_.Begin()); }
  Result<std::unique_ptr<StoreTransaction>> BeginDeferred() override { return Wrap(inner_.BeginDeferred()); }
  Result<std::optional<Marker>> FindMarker(std::string_view consumer, std::string_view id,
                                           std::optional<int64_t> produced_at_ms) override {
    return inner_.FindMarker(consumer, id, produced_at_ms);
  }
  Result<FailureCount> RecordFailure(const FailureRecord& failure) override { return inner_.RecordFailure(failure); }
  Status ClearFailures(std::string_view consumer, std::string_view id) override {
    return inner_.ClearFailures(consumer, id);
  }
  Result<int64_t> Purge(std::string_view consumer, int64_t before_ms, int batch_size) override {
    return inner_.Purge(consumer, before_ms, batch_size);
  }
  Result<int64_t> CountMarkers(std::string_view consumer) override { return inner_.CountMarkers(consumer); }
  Result<std::vector<Marker>> ListMarkers(std::string_view consumer, int limit) override {
    return inner_.ListMarkers(consumer, limit);
  }
  Result<std::vector<DeadLetter>> ListDeadLetters(std::string_view consumer, int limit) override {
    return inner_.ListDeadLetters(consumer, limit);
  }
  Result<SchemaInfo> Schema() override { return inner_.Schema(); }
  std::string_view Kind() const override { return inner_.Kind(); }
  ClaimStore* claim_store() override { return inner_.claim_store(); }
  OutboxStore* outbox_store() override { return inner_.outbox_store(); }
  std::string WriteLockId() const override { return inner_.WriteLockId(); }

 private:
  Result<std::unique_ptr<StoreTransaction>> Wrap(Result<std::unique_ptr<StoreTransaction>> tx) {
    if (!tx.ok()) return tx.status();
    std::unique_ptr<StoreTransaction> out = std::make_unique<FaultyTx>(std::move(*tx), plan_);
    plan_.Hit(kBeforeMarker);
    if (auto hook = plan_.TakeOnBegin()) hook();
    return out;
  }
  Store& inner_;
  Plan& plan_;
};

// Where one run lives: its directory, its store's URL, its clock.
struct RunSpec {
  std::string dir;
  std::string url;
  std::string consumer;
  FakeEnv* clock = nullptr;
};

// One process's view of a run: the store (real and faulty), Claims, the
// fake service, and the subject made from them.
class RunCtx final : public Context {
 public:
  static Result<std::unique_ptr<RunCtx>> Open(const RunSpec& spec, Plan& plan, const Subject& subject) {
    std::unique_ptr<RunCtx> c(new RunCtx(spec, plan, static_cast<bool>(subject.consumer)));
    IDEM_ASSIGN_OR_RETURN(c->inner_, OpenStore(spec.url, {.env = spec.clock}));
    c->faulty_ = std::make_unique<FaultyStore>(*c->inner_, plan);
    // On SQLite the claims live in a file of their own, so that a CallOnce
    // inside a Handler's transaction (which holds the store's write lock)
    // can commit its claim; elsewhere in the store's database.
    ClaimStore* claim_store = c->inner_->claim_store();
    if (c->inner_->Kind() == "sqlite") {
      IDEM_ASSIGN_OR_RETURN(c->own_claims_,
                            OpenClaimStore("sqlite:" + spec.dir + "/claims.db?synchronous=normal&checkpoint=inline",
                                           {.env = spec.clock}));
      claim_store = c->own_claims_.get();
    }
    if (claim_store == nullptr) {
      return Status::InvalidArgument("idem::testing: the store at " + spec.url + " has no claim store");
    }
    IDEM_ASSIGN_OR_RETURN(c->claims_, Claims::Open(*claim_store, {.env = spec.clock}));
    c->downstream_ = std::make_unique<FakeDownstream>(spec.dir + "/downstream.db");
    if (subject.handler || subject.call_first) {
      IDEM_ASSIGN_OR_RETURN(c->inbox_, Inbox::Open(*c->faulty_, {.consumer = spec.consumer, .env = spec.clock}));
    }
    if (subject.handler) {
      c->handler_ = subject.handler(*c);
      if (!c->handler_) return Status::InvalidArgument("idem::testing: Subject::handler made an empty Handler");
    } else if (subject.call_first) {
      c->call_first_.emplace(subject.call_first(*c));
      if (!c->call_first_->complete()) {
        return Status::InvalidArgument("idem::testing: Subject::call_first made a CallFirst without both parts");
      }
    } else {
      c->consumer_ = subject.consumer(*c);
      if (!c->consumer_) return Status::InvalidArgument("idem::testing: Subject::consumer made an empty function");
    }
    return c;
  }

  // A Handler's or a CallFirst's own transactions (a read in the calls part)
  // are not the Inbox's: they reach no crash point, so a child is never
  // stopped holding a claim where the Inbox could not be. A consumer of the
  // user's own gets the faulty store: its transactions are the subject's.
  Store& store() override { return subject_is_consumer_ ? static_cast<Store&>(*faulty_) : *inner_; }
  Claims& claims() override { return *claims_; }
  FakeDownstream& downstream() override { return *downstream_; }
  const std::string& dir() const override { return spec_.dir; }
  Env& env() override { return *spec_.clock; }
  const std::string& store_url() const override { return spec_.url; }
  Store& real_store() { return *inner_; }

  // One delivery; true when it may be acknowledged (then "after_commit").
  // `why`: what went wrong when not.
  bool Deliver(const Message& m, std::string* why) {
    bool ack = false;
    if (inbox_) {
      Outcome o = handler_ ? inbox_->Handle(m, handler_) : inbox_->Handle(m, *call_first_);
      ack = o.ShouldAck();
      if (!ack && why) *why = o.status.ToString();
    } else {
      Status s;
      try {
        s = consumer_(m);
      } catch (const std::exception& e) {
        s = Status::HandlerFailed(std::string("threw: ") + e.what());
      }
      ack = s.ok();
      if (!ack && why) *why = s.ToString();
    }
    if (ack) plan_.Hit(kAfterCommit);
    return ack;
  }

 private:
  RunCtx(const RunSpec& spec, Plan& plan, bool subject_is_consumer)
      : spec_(spec), plan_(plan), subject_is_consumer_(subject_is_consumer) {}
  RunSpec spec_;
  Plan& plan_;
  const bool subject_is_consumer_;
  std::unique_ptr<Store> inner_;
  std::unique_ptr<FaultyStore> faulty_;
  std::unique_ptr<ClaimStore> own_claims_;
  std::unique_ptr<Claims> claims_;
  std::unique_ptr<FakeDownstream> downstream_;
  std::unique_ptr<Inbox> inbox_;
  Handler handler_;
  std::optional<CallFirst> call_first_;
  std::function<Status(const Message&)> consumer_;
};

std::string Line(const Rows& rows, size_t r) {
  std::string line;
  for (size_t c = 0; c < rows.columns.size(); ++c) {
    if (c) line += ' ';
    const Value& v = rows.rows[r][c];
    line += rows.columns[c] + "=" + (v.is_null() ? std::string("NULL") : Printable(v.AsText(), 200));
  }
  return line;
}

// Lines only in `a`, as a sorted multiset difference.
std::vector<std::string> Minus(std::vector<std::string> a, std::vector<std::string> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<std::string> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// Runs a scenario's deliveries and compares; one per scenario run.
class Run {
 public:
  Run(const Harness::Options& options, const Subject& subject, const std::vector<Message>& messages,
      const std::vector<std::vector<std::string>>* clean, Report& report)
      : o_(options), subject_(subject), messages_(messages), clean_(clean), report_(report) {}

  // Makes the run's place: a directory, a fresh store (a schema of its own
  // on PostgreSQL) with the business tables, the parent's context.
  Status Start(const std::string& root, int n, Store* pg_admin) {
    spec_.dir = root + "/run-" + std::to_string(n);
    std::filesystem::create_directories(spec_.dir);
    spec_.consumer = o_.consumer;
    spec_.clock = &clock_;
    if (o_.store_url.empty()) {
      spec_.url = "sqlite:" + spec_.dir + "/store.db?synchronous=normal&checkpoint=inline";
    } else if (UrlScheme(o_.store_url) == "dynamodb") {
      // DynamoDB: a table of the run's own, the URL's name suffixed (use
      // DynamoDB Local: the runs' tables are left behind).
      IDEM_ASSIGN_OR_RETURN(ParsedUrl u, ParseUrl(o_.store_url, "DynamoDB store URL"));
      if (u.hosts.size() != 1) return Status::InvalidArgument("idem::testing: a DynamoDB URL names one table");
      u.hosts[0].host += "-run-" + std::to_string(::getpid()) + "-" + std::to_string(n);
      spec_.url = FormatUrl(u);
    } else {
      pg_schema_ = "idem_testing_" + std::to_string(::getpid()) + "_" + std::to_string(n);
      auto tx = pg_admin->Begin();
      if (!tx.ok()) return tx.status().WithContext("idem::testing: making the run's schema");
      IDEM_RETURN_IF_ERROR((*tx)->Exec("DROP SCHEMA IF EXISTS " + pg_schema_ + " CASCADE").status());
      IDEM_RETURN_IF_ERROR((*tx)->Exec("CREATE SCHEMA " + pg_schema_).status());
      IDEM_RETURN_IF_ERROR((*tx)->Commit());
      spec_.url = o_.store_url + (o_.store_url.find('?') == std::string::npos ? "?" : "&") +
                  "options=-csearch_path%3D" + pg_schema_;
    }
    IDEM_RETURN_IF_ERROR(Reopen());
    auto tx = ctx_->real_store().Begin();
    if (!tx.ok()) return tx.status().WithContext("idem::testing: the business tables");
    for (const std::string& sql : o_.schema) {
      Status s = (*tx)->Exec(sql).status();
      if (!s.ok()) return s.WithContext("idem::testing: schema statement \"" + Printable(sql) + "\"");
    }
    return (*tx)->Commit().WithContext("idem::testing: the business tables");
  }
  void Finish(Store* pg_admin) {
    ctx_.reset();
    if (!pg_schema_.empty() && pg_admin != nullptr) {
      if (auto tx = pg_admin->Begin(); tx.ok()) {
        (void)(*tx)->Exec("DROP SCHEMA IF EXISTS " + pg_schema_ + " CASCADE");
        (void)(*tx)->Commit();
      }
    }
  }

  // A fresh consumer in this process (after a crash, before a fork).
  Status Reopen() {
    ctx_.reset();
    IDEM_ASSIGN_OR_RETURN(ctx_, RunCtx::Open(spec_, plan_, subject_));
    return Status::OK();
  }
  void Close() { ctx_.reset(); }
  RunCtx& ctx() { return *ctx_; }
  Plan& plan() { return plan_; }
  FakeEnv& clock() { return clock_; }
  const RunSpec& spec() const { return spec_; }

  Result<std::vector<std::string>> State() {
    std::vector<std::string> lines;
    if (!o_.state_query.empty()) {
      auto tx = ctx_->real_store().Begin();
      if (!tx.ok()) return tx.status().WithContext("idem::testing: reading the state");
      auto rows = (*tx)->Query(o_.state_query);
      if (!rows.ok()) return rows.status().WithContext("idem::testing: the state query \"" + o_.state_query + "\"");
      (*tx)->Rollback();
      for (size_t r = 0; r < rows->rows.size(); ++r) lines.push_back(Line(*rows, r));
    }
    if (o_.state) {
      auto st = o_.state(*ctx_);
      if (!st.ok()) return st.status().WithContext("idem::testing: Options::state");
      lines.insert(lines.end(), st->lines.begin(), st->lines.end());
    }
    auto effects = ctx_->downstream().Effects();
    if (!effects.ok()) return effects.status();
    for (std::string& e : *effects) lines.push_back("downstream: " + std::move(e));
    return lines;
  }

  // One delivery in this process, counted; marks the message acknowledged.
  bool Deliver(size_t i, int attempt, std::string* why = nullptr) {
    Message m = messages_[i];
    m.attempt = attempt;
    deliveries_++;
    bool ack = ctx_->Deliver(m, why);
    if (ack) Ack(i);
    return ack;
  }
  void Ack(size_t i) {
    std::lock_guard<std::mutex> l(mu_);
    if (acked_.size() < messages_.size()) acked_.resize(messages_.size());
    acked_[i] = true;
  }
  int NextAttempt(size_t i) {
    std::lock_guard<std::mutex> l(mu_);
    return ++attempts_[i];
  }
  bool Acked(size_t i) {
    std::lock_guard<std::mutex> l(mu_);
    return i < acked_.size() && acked_[i];
  }

  // Delivers every message not yet acknowledged until it is, as a broker
  // would, letting leases run out between tries. False (and a failure
  // recorded) when one never is.
  bool Drain(Scenario sc) {
    for (size_t i = 0; i < messages_.size(); ++i) {
      std::string why;
      int tries = 0;
      while (!Acked(i)) {
        if (++tries > o_.max_deliveries) {
          Fail(sc,
               "\"" + messages_[i].id + "\" was never acknowledged in " + std::to_string(o_.max_deliveries) +
                   " more deliveries; the last: " + why,
               messages_[i].id, {}, {});
          return false;
        }
        if (!Deliver(i, NextAttempt(i), &why)) clock_.Advance(o_.lease_expiry_ms);
      }
    }
    return true;
  }

  // Compares the state with the clean run's after the first k messages,
  // when the messages acknowledged so far are exactly those (a state
  // between two of the clean run's cannot be compared). True when equal,
  // or not comparable now.
  bool CheckPrefix(Scenario sc, const std::string& what, size_t i) {
    size_t k = 0;
    {
      std::lock_guard<std::mutex> l(mu_);
      acked_.resize(messages_.size());
      while (k < acked_.size() && acked_[k]) k++;
      for (size_t j = k; j < acked_.size(); ++j)
        if (acked_[j]) return true;
    }
    return Compare(sc, what, messages_[i].id, k);
  }
  bool CheckEnd(Scenario sc, const std::string& what) { return Compare(sc, what, "", messages_.size()); }

  void Fail(Scenario sc, std::string what, std::string id, std::vector<std::string> expected,
            std::vector<std::string> found) {
    Failure f;
    f.scenario = sc;
    f.what = std::move(what);
    f.message_id = std::move(id);
    for (auto& l : Minus(expected, found)) f.diff.push_back("- " + l);
    for (auto& l : Minus(found, expected)) f.diff.push_back("+ " + l);
    f.expected = std::move(expected);
    f.found = std::move(found);
    report_.failures.push_back(std::move(f));
    failed_ = true;
  }
  bool failed() const { return failed_; }
  int64_t deliveries() const { return deliveries_; }
  void AddDeliveries(int64_t n) { deliveries_ += n; }
  size_t size() const { return messages_.size(); }
  const Message& message(size_t i) const { return messages_[i]; }
  const Subject& subject() const { return subject_; }
  int64_t lease_expiry_ms() const { return o_.lease_expiry_ms; }

  // Forks a child that opens the run afresh (its own consumer, store
  // connections and plan, killed at `kill_at`) and runs `body` there. The
  // parent's context is closed first (a forked copy of open connections and
  // threads is unsafe to use) and opened again after. True when the child
  // was killed by SIGKILL.
  Result<bool> Child(const std::string& kill_at, const std::function<void(RunCtx& ctx)>& body) {
    Close();
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return Status::Internal("idem::testing: fork failed");
    if (pid == 0) {
      Plan plan;
      plan.kill_at = kill_at;
      auto ctx = RunCtx::Open(spec_, plan, subject_);
      if (!ctx.ok()) {
        std::fprintf(stderr, "idem::testing: a child could not open the run: %s\n", ctx.status().ToString().c_str());
        std::fflush(nullptr);
        ::_exit(3);
      }
      body(**ctx);
      std::fflush(nullptr);
      ::_exit(0);
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    IDEM_RETURN_IF_ERROR(Reopen());
    if (WIFEXITED(st) && WEXITSTATUS(st) == 3) return Status::Internal("idem::testing: a child could not open the run");
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
  }

 private:
  bool Compare(Scenario sc, const std::string& what, const std::string& id, size_t k) {
    if (failed_) return false;
    auto found = State();
    if (!found.ok()) {
      Fail(sc, what + "; then reading the state failed: " + found.status().ToString(), id, {}, {});
      return false;
    }
    const std::vector<std::string>& expected = (*clean_)[k];
    if (Minus(expected, *found).empty() && Minus(*found, expected).empty()) return true;
    Fail(sc, what, id, expected, *found);
    return false;
  }

  const Harness::Options& o_;
  const Subject& subject_;
  const std::vector<Message>& messages_;
  const std::vector<std::vector<std::string>>* clean_;
  Report& report_;
  RunSpec spec_;
  Plan plan_;
  FakeEnv clock_;
  std::string pg_schema_;
  std::unique_ptr<RunCtx> ctx_;
  std::mutex mu_;
  std::vector<bool> acked_;
  std::map<size_t, int> attempts_;
  std::atomic<int64_t> deliveries_{0};
  bool failed_ = false;
};

// What a scenario needs besides its run.
struct Setting {
  bool serialized = true;        // the store's writers wait for one another (SQLite)
  bool server_clock = false;     // leases run on the server's clock (PostgreSQL)
  bool uses_downstream = false;  // the clean run called the fake service
};

std::string Quoted(const std::string& id) { return "\"" + Printable(id) + "\""; }

// Delivers message i until it is acknowledged (letting leases run out
// between tries); false, with a failure, when it never is.
bool UntilAcked(Run& r, Scenario sc, size_t i, const std::string& what, int max) {
  std::string why;
  for (int n = 0; n < max; ++n) {
    if (r.Deliver(i, r.NextAttempt(i), &why)) return true;
    r.clock().Advance(r.lease_expiry_ms());  // a redelivery comes later: a holder's lease has run out
  }
  r.Fail(sc,
         what + "; then " + Quoted(r.message(i).id) + " was never acknowledged in " + std::to_string(max) +
             " more deliveries; the last: " + why,
         r.message(i).id, {}, {});
  return false;
}

void Twice(Run& r) {
  for (size_t i = 0; i < r.size(); ++i) {
    for (int copy = 1; copy <= 2; ++copy) {
      const int at = r.NextAttempt(i);
      if (r.Deliver(i, at) && !r.CheckPrefix(Scenario::kTwice,
                                             "delivery " + std::to_string(at) + " of " + Quoted(r.message(i).id) +
                                                 " (each message delivered twice in a row)",
                                             i))
        return;
    }
  }
  if (r.Drain(Scenario::kTwice)) r.CheckEnd(Scenario::kTwice, "every message delivered twice in a row");
}

void Interleaved(Run& r) {
  const size_t n = r.size();
  for (size_t step = 0; step < n + 3; ++step) {
    for (size_t d = 0; d <= 3 && d <= step; ++d) {
      const size_t j = step - d;
      if (j >= n) continue;
      const int at = r.NextAttempt(j);
      if (r.Deliver(j, at) && !r.CheckPrefix(Scenario::kInterleaved,
                                             "delivery " + std::to_string(at) + " of " + Quoted(r.message(j).id) +
                                                 " (each message 4 times, each redelivery after the next messages)",
                                             j))
        return;
    }
  }
  if (r.Drain(Scenario::kInterleaved)) {
    r.CheckEnd(Scenario::kInterleaved, "every message delivered 4 times, redeliveries among later messages");
  }
}

// Runs `a` and `b` in two threads that start together.
void Together(const std::function<void()>& a, const std::function<void()>& b) {
  std::mutex mu;
  std::condition_variable cv;
  int ready = 0;
  auto start = [&] {
    std::unique_lock<std::mutex> l(mu);
    if (++ready == 2) cv.notify_all();
    cv.wait(l, [&] { return ready == 2; });
  };
  std::thread ta([&] { start(), a(); });
  std::thread tb([&] { start(), b(); });
  ta.join();
  tb.join();
}

void Race(Run& r, const Setting& s) {
  r.plan().rendezvous = !s.serialized;
  for (size_t i = 0; i < r.size(); ++i) {
    std::atomic<bool> any{false};
    auto copy = [&] { any = r.Deliver(i, 1) || any; };
    Together(copy, copy);
    if (any && !r.CheckPrefix(Scenario::kRace,
                              "two copies of " + Quoted(r.message(i).id) + " delivered at once in two threads", i))
      return;
  }
  r.plan().rendezvous = false;
  if (r.Drain(Scenario::kRace)) r.CheckEnd(Scenario::kRace, "two copies of each message at once, in two threads");
}

void Concurrent(Run& r, const Setting& s) {
  r.plan().rendezvous = !s.serialized;
  const size_t n = r.size();
  // Thread `first` takes the messages of its parity, then the others: the
  // two run different messages side by side, then each other's again.
  auto half = [&](size_t first) {
    for (size_t pass = 0; pass < 2; ++pass)
      for (size_t i = (first + pass) % 2; i < n; i += 2) r.Deliver(i, r.NextAttempt(i));
  };
  Together([&] { half(0); }, [&] { half(1); });
  r.plan().rendezvous = false;
  if (r.Drain(Scenario::kConcurrent)) {
    r.CheckEnd(Scenario::kConcurrent,
               "every message from two threads at once, each taking every other message, then the other's");
  }
}

void Processes(Run& r) {
  r.Close();
  std::fflush(nullptr);
  std::vector<pid_t> kids;
  for (int k = 0; k < 2; ++k) {
    pid_t pid = ::fork();
    if (pid == 0) {
      Plan plan;
      auto ctx = RunCtx::Open(r.spec(), plan, r.subject());
      if (!ctx.ok()) ::_exit(3);
      for (size_t i = 0; i < r.size(); ++i) {
        for (int at = 1; at <= 2; ++at) {
          Message m = r.message(i);
          m.attempt = at;
          (*ctx)->Deliver(m, nullptr);
        }
      }
      std::fflush(nullptr);
      ::_exit(0);
    }
    if (pid > 0) kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
  }
  r.AddDeliveries(static_cast<int64_t>(kids.size() * r.size() * 2));
  if (Status s = r.Reopen(); !s.ok()) {
    r.Fail(Scenario::kProcesses, "reopening after two processes ran failed: " + s.ToString(), "", {}, {});
    return;
  }
  if (r.Drain(Scenario::kProcesses)) {
    r.CheckEnd(Scenario::kProcesses, "two processes delivering every message twice, at once");
  }
}

// The crash points this subject reaches, and those left out.
std::vector<std::string> CrashPoints(const Setting& s) {
  std::vector<std::string> p = {kBeforeMarker, kAfterMarker, kAfterWork, kCommitDone, kAfterCommit};
  if (s.uses_downstream && !s.server_clock) p.push_back(kAfterCall);
  return p;
}

void Crash(Run& r, const std::string& point, int options_max, int64_t lease_ms) {
  for (size_t i = 0; i < r.size(); ++i) {
    int killed = 0;
    for (int c = 0; c < 2; ++c) {
      const int at = r.NextAttempt(i);
      auto child = r.Child(point, [&](RunCtx& ctx) {
        if (point == kAfterCall) ctx.downstream().Arm({.kind = FakeDownstream::Fault::Kind::kKillAfterWork});
        Message m = r.message(i);
        m.attempt = at;
        ctx.Deliver(m, nullptr);
      });
      if (!child.ok()) {
        r.Fail(Scenario::kCrash, "a child for " + point + ": " + child.status().ToString(), r.message(i).id, {}, {});
        return;
      }
      killed += *child ? 1 : 0;
      r.AddDeliveries(1);
      r.clock().Advance(1);
    }
    // The dead holders' leases run out before the next delivery.
    r.clock().Advance(lease_ms);
    const std::string what = "killed at " + point + " on deliveries 1 and 2 of " + Quoted(r.message(i).id) +
                             (killed == 2 ? "" : " (reached " + std::to_string(killed) + " of 2 times)") +
                             ", then delivered again to a fresh consumer";
    if (!UntilAcked(r, Scenario::kCrash, i, what, options_max)) return;
    if (!r.CheckPrefix(Scenario::kCrash, what, i)) return;
  }
  r.CheckEnd(Scenario::kCrash, "every message killed twice at " + point + ", then delivered again");
}

void InDoubt(Run& r, int max) {
  for (size_t i = 0; i < r.size(); ++i) {
    r.plan().in_doubt = 1;
    r.Deliver(i, r.NextAttempt(i));
    r.plan().in_doubt = 2;
    r.Deliver(i, r.NextAttempt(i));
    r.plan().in_doubt = 0;
    const std::string what = "the commit of " + Quoted(r.message(i).id) +
                             " reported in doubt twice (rolled back on delivery 1, committed on delivery 2)";
    if (!UntilAcked(r, Scenario::kInDoubt, i, what, max)) return;
    if (!r.CheckPrefix(Scenario::kInDoubt, what, i)) return;
  }
  r.CheckEnd(Scenario::kInDoubt, "every commit reported in doubt, once rolled back and once committed");
}

void LeaseExpiry(Run& r, const Subject& subject, const Setting& s, int64_t lease_ms, int max) {
  for (size_t i = 0; i < r.size(); ++i) {
    const int first = r.NextAttempt(i), second = r.NextAttempt(i);
    std::thread other;
    std::mutex mu;
    auto start_other = [&] {
      std::lock_guard<std::mutex> l(mu);
      if (!other.joinable()) other = std::thread([&] { r.Deliver(i, second); });
    };
    if (s.uses_downstream) {
      // While the first delivery's call is out, its lease runs out and the
      // second delivery runs; a CallFirst holds no transaction then, so the
      // second runs to its end before the first goes on.
      r.ctx().downstream().OnNextEffect([&] {
        r.clock().Advance(lease_ms);
        start_other();
        if (subject.call_first) {
          std::lock_guard<std::mutex> l(mu);
          other.join();
        }
      });
    } else {
      r.plan().on_begin = [&] { start_other(); };
    }
    r.Deliver(i, first);
    r.ctx().downstream().OnNextEffect(nullptr);
    r.plan().TakeOnBegin();
    {
      std::lock_guard<std::mutex> l(mu);
      if (other.joinable()) other.join();
    }
    const std::string what = "a second delivery of " + Quoted(r.message(i).id) + " started while the first still ran" +
                             (s.uses_downstream ? " (its call out, its lease run out)" : "");
    if (!UntilAcked(r, Scenario::kLeaseExpiry, i, what, max)) return;
    if (!r.CheckPrefix(Scenario::kLeaseExpiry, what, i)) return;
  }
  r.CheckEnd(Scenario::kLeaseExpiry, "a second delivery of every message while the first still ran");
}

void LostResponse(Run& r, int max) {
  for (size_t i = 0; i < r.size(); ++i) {
    r.ctx().downstream().Arm({.kind = FakeDownstream::Fault::Kind::kLoseResponse});
    const std::string what = "the answer to the first call for " + Quoted(r.message(i).id) +
                             " lost after the service did the work, then delivered again";
    bool ok = UntilAcked(r, Scenario::kLostResponse, i, what, max);
    r.ctx().downstream().Arm({});
    if (!ok || !r.CheckPrefix(Scenario::kLostResponse, what, i)) return;
  }
  r.CheckEnd(Scenario::kLostResponse, "the first call's answer for every message lost");
}

// The production store to steer to, in words.
constexpr const char* kOnPostgres =
    "run the kit on your production store to see it (Options::store_url: PostgreSQL, "
    "TempPostgres in idem/testing/throwaway.h starts one)";

// A store whose writers run one at a time (SQLite) hides two classic
// mistakes: say which, and where they show.
void NoteWhatSerialisedWritersHide(Report& report) {
  const bool locked = std::any_of(report.clean_errors.begin(), report.clean_errors.end(), [](const std::string& e) {
    return e.find("database is locked") != std::string::npos;
  });
  if (locked) {
    report.notes.push_back(
        "\"database is locked\" in the clean run: the likely mistake is a write through a second connection "
        "(a Store or a database handle of the handler's own instead of the Transaction the Inbox hands it): on " +
        report.store_kind +
        " it waits for the Inbox's write lock, on a store that lets it through it commits apart from the marker "
        "and a crash doubles it; write through the Inbox's Transaction, and " +
        kOnPostgres);
  }
  report.notes.push_back("on " + report.store_kind +
                         " writers run one at a time, so a read-then-write without a lock (a lost update: "
                         "SELECT then UPDATE without FOR UPDATE) cannot show here; " +
                         kOnPostgres);
}

}  // namespace

Harness::Harness(Options options) : options_(std::move(options)) {}
Harness::~Harness() = default;

Result<Report> Harness::Run(const Subject& subject, const std::vector<Message>& messages) {
  const int kinds = (subject.handler ? 1 : 0) + (subject.call_first ? 1 : 0) + (subject.consumer ? 1 : 0);
  if (kinds != 1) {
    return Status::InvalidArgument(
        "idem::testing::Harness::Run: a Subject needs exactly one of handler, call_first "
        "and consumer; it has " +
        std::to_string(kinds));
  }
  if (messages.empty()) return Status::InvalidArgument("idem::testing::Harness::Run: no messages to deliver");
  {
    std::map<std::string, size_t> seen;
    for (size_t i = 0; i < messages.size(); ++i) {
      IDEM_RETURN_IF_ERROR(
          ValidateId(messages[i].id).WithContext("idem::testing::Harness::Run: message " + std::to_string(i)));
      if (!seen.emplace(messages[i].id, i).second) {
        return Status::InvalidArgument("idem::testing::Harness::Run: messages " + std::to_string(seen[messages[i].id]) +
                                       " and " + std::to_string(i) + " share the id " + Quoted(messages[i].id) +
                                       " (the harness delivers each message several times itself)");
      }
    }
  }
  if (options_.state_query.empty() && !options_.state) {
    return Status::InvalidArgument(
        "idem::testing::Harness: no state to compare: set Options::state_query or "
        "Options::state");
  }
  TempDir root("idem-harness");
  std::unique_ptr<Store> admin;
  if (!options_.store_url.empty() && UrlScheme(options_.store_url) != "dynamodb") {  // PostgreSQL: makes the schemas
    IDEM_ASSIGN_OR_RETURN(admin, OpenStore(options_.store_url));
  }
  Report report;
  report.subject = subject.name;
  int n = 0;

  // The clean run: each message once, in order; the state after each.
  std::vector<std::vector<std::string>> clean;
  Setting setting;
  {
    testing::Run r(options_, subject, messages, nullptr, report);
    IDEM_RETURN_IF_ERROR(r.Start(root.path(), n++, admin.get()));
    report.store_kind = std::string(r.ctx().real_store().Kind());
    setting.serialized = !r.ctx().real_store().WriteLockId().empty();
    setting.server_clock = report.store_kind == "postgres";
    IDEM_ASSIGN_OR_RETURN(auto before, r.State());
    clean.push_back(std::move(before));
    for (size_t i = 0; i < messages.size(); ++i) {
      std::string why;
      if (!r.Deliver(i, r.NextAttempt(i), &why)) {
        report.clean_errors.push_back("the clean run's only delivery of " + Quoted(messages[i].id) +
                                      " was not acknowledged: " + why);
      }
      IDEM_ASSIGN_OR_RETURN(auto after, r.State());
      clean.push_back(std::move(after));
    }
    auto calls = r.ctx().downstream().Calls();
    IDEM_RETURN_IF_ERROR(calls.status());
    setting.uses_downstream = !calls->empty();
    report.deliveries += r.deliveries();
    r.Finish(admin.get());
  }
  if (setting.serialized) NoteWhatSerialisedWritersHide(report);
  if (!report.clean_errors.empty()) return report;

  for (Scenario sc : options_.scenarios) {
    std::vector<std::string> points = {""};
    if (sc == Scenario::kCrash) points = CrashPoints(setting);
    if (sc == Scenario::kLostResponse && !setting.uses_downstream) {
      report.skipped.push_back("lost_response: the subject made no call to Context::downstream()");
      continue;
    }
    if (sc == Scenario::kCrash && setting.uses_downstream && setting.server_clock) {
      report.skipped.push_back(
          "crash at downstream.after_call: on PostgreSQL a dead holder's lease runs out on the "
          "server's clock (CallOnceOptions::lease_ms of real time)");
    }
    for (const std::string& point : points) {
      testing::Run r(options_, subject, messages, &clean, report);
      IDEM_RETURN_IF_ERROR(r.Start(root.path(), n++, admin.get()));
      switch (sc) {
        case Scenario::kTwice: Twice(r); break;
        case Scenario::kInterleaved: Interleaved(r); break;
        case Scenario::kRace: Race(r, setting); break;
        case Scenario::kConcurrent: Concurrent(r, setting); break;
        case Scenario::kProcesses: Processes(r); break;
        case Scenario::kCrash: Crash(r, point, options_.max_deliveries, options_.lease_expiry_ms); break;
        case Scenario::kInDoubt: InDoubt(r, options_.max_deliveries); break;
        case Scenario::kLeaseExpiry:
          LeaseExpiry(r, subject, setting, options_.lease_expiry_ms, options_.max_deliveries);
          break;
        case Scenario::kLostResponse: LostResponse(r, options_.max_deliveries); break;
      }
      report.deliveries += r.deliveries();
      r.Finish(admin.get());
      if (r.failed()) break;  // one failure per scenario
    }
    report.ran.push_back(sc);
  }
  return report;
}

std::string Report::ToString() const {
  std::ostringstream os;
  const size_t broke = failures.size();
  if (!clean_errors.empty()) {
    os << "idem::testing: " << Quoted(subject) << " on " << store_kind
       << " failed its clean run (each message delivered once), so nothing was compared:\n";
    for (const std::string& e : clean_errors) os << "  " << e << "\n";
    for (const std::string& n : notes) os << "  note: " << n << "\n";
    return os.str();
  }
  if (broke == 0) {
    os << "idem::testing: " << Quoted(subject) << " on " << store_kind << " is idempotent in " << ran.size()
       << " scenarios (" << deliveries << " deliveries)";
  } else {
    os << "idem::testing: " << Quoted(subject) << " on " << store_kind << " is NOT idempotent: " << broke << " of "
       << ran.size() << " scenarios broke it\n";
    for (const Failure& f : failures) {
      os << "\n[" << ScenarioName(f.scenario) << "] " << f.what << "\n";
      if (!f.message_id.empty()) os << "  message: " << Quoted(f.message_id) << "\n";
      if (!f.diff.empty()) {
        os << "  the state differs from one clean delivery of each message (- expected, + found):\n";
        for (const std::string& d : f.diff) os << "    " << d << "\n";
      }
    }
  }
  if (!skipped.empty()) {
    os << (broke ? "" : "\n") << "  not run: ";
    for (size_t i = 0; i < skipped.size(); ++i) os << (i ? "; " : "") << skipped[i];
  }
  for (const std::string& n : notes) os << "\n  note: " << n;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Report& report) { return os << report.ToString(); }

}  // namespace idem::testing
