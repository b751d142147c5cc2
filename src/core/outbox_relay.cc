// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The relay's loop: fetch the lanes' oldest unsettled rows, hand them to
// the publisher in rounds that keep each key's order, settle what the broker
// answered in one transaction, sleep when nothing is left.
#include "idem/outbox_relay.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/backoff.h"
#include "core/kill_point.h"
#include "core/signal_stop.h"

namespace idem {

struct OutboxRelay::State {
  mutable std::mutex mu;
  OutboxRelayStats stats;
  class Loop;  // Run's phases (below)
};

namespace {

// Microseconds since `since` on the steady clock (the relay's own
// accounting, not a decision: no Env).
uint64_t MicrosSince(std::chrono::steady_clock::time_point since) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - since).count());
}

bool Permanent(const Status& s) { return s.IsInvalidArgument() || s.IsRejected(); }

// The Message a row becomes on the wire.
Message ToMessage(const OutboxRow& row) {
  Message m;
  m.id = row.id;
  m.producer_time_ms = row.producer_time_ms;
  m.payload = row.payload;
  m.headers = row.headers;
  m.headers.emplace_back(std::string(kOutboxSeqHeader), std::to_string(row.seq));
  return m;
}

}  // namespace

OutboxRelay::OutboxRelay(OutboxStore& store, Publisher& publisher, const Options& options)
    : store_(store), publisher_(publisher), options_(options), state_(std::make_unique<State>()) {}
// A signal after this must not reach a destroyed relay (StopOnSignals).
OutboxRelay::~OutboxRelay() { internal::DetachFromSignals(this); }

Result<std::unique_ptr<OutboxRelay>> OutboxRelay::Open(Store& store, Publisher& publisher, const Options& options) {
  OutboxStore* os = store.outbox_store();
  if (os == nullptr) return Status::InvalidArgument("the " + std::string(store.Kind()) + " store has no outbox");
  auto bad = [](std::string what) { return Status::InvalidArgument("OutboxRelay::Options::" + what); };
  if (options.batch < 1 || options.batch > 10'000) return bad("batch must be 1..10000");
  if (options.poll_ms < 1) return bad("poll_ms must be at least 1");
  if (options.max_attempts < 0) return bad("max_attempts must not be negative");
  if (options.backoff_base_ms < 0 || options.backoff_max_ms < options.backoff_base_ms)
    return bad("backoff_base_ms must be 0..backoff_max_ms");
  if (options.rebalance_ms < 1) return bad("rebalance_ms must be at least 1");
  if (options.name.empty() || options.name.size() > 200) return bad("name must be 1..200 bytes");
  Options o = options;
  if (o.env == nullptr) o.env = Env::Default();
  return std::unique_ptr<OutboxRelay>(new OutboxRelay(*os, publisher, o));
}

OutboxRelayStats OutboxRelay::stats() const {
  std::lock_guard lock(state_->mu);
  return state_->stats;
}

void OutboxRelay::Notify(const std::vector<OutboxRow>& rows, const OutboxSettlement& settled,
                         int64_t republished) const {
  std::unordered_map<int64_t, const OutboxRow*> by_seq;
  for (const OutboxRow& r : rows) by_seq[r.seq] = &r;
  const int64_t now = settled.now_ms;
  auto tell = [&](EventKind kind, const OutboxRow* r, std::string_view detail) {
    if (r == nullptr) return;
    Event e;
    e.kind = kind;
    e.consumer = options_.name;
    e.message_id = r->id;
    e.attempt = static_cast<int>(r->attempts) + 1;
    e.detail = detail;
    for (const auto& [name, value] : r->headers)
      if (name == "traceparent") e.traceparent = value;
    e.at_ms = now;
    options_.observer->OnEvent(e);
  };
  // The rows handed over before are a round's first (each lane's in seq
  // order), as many as the fetch counted.
  std::vector<int64_t> sent(settled.sent.begin(), settled.sent.end());
  std::sort(sent.begin(), sent.end());
  for (size_t i = 0; i < sent.size(); ++i) {
    const OutboxRow* r = by_seq.count(sent[i]) ? by_seq[sent[i]] : nullptr;
    tell(static_cast<int64_t>(i) < republished ? EventKind::kOutboxRepublished : EventKind::kOutboxPublished, r,
         r != nullptr ? std::string_view(r->destination) : std::string_view());
  }
  for (const OutboxDeadLetter& d : settled.dead) tell(EventKind::kOutboxDeadLettered, &d.row, d.reason);
  for (const auto& [seq, error] : settled.failed)
    tell(EventKind::kOutboxTransientError, by_seq.count(seq) ? by_seq[seq] : nullptr, error);
}

// One Run: the phases of doc/architecture.md ("The outbox"), each a member,
// sharing what a turn of the loop found.
class OutboxRelay::State::Loop {
 public:
  explicit Loop(OutboxRelay& relay)
      : r_(relay),
        env_(*relay.options_.env),
        name_(relay.options_.name + ":" + std::to_string(::getpid()) + ":" +
              std::to_string(reinterpret_cast<uintptr_t>(&relay) % 100000)),
        traits_(relay.publisher_.traits()),
        max_batch_(static_cast<size_t>(std::max(1, traits_.max_batch))) {}

  Status Run() {
    while (!r_.stop_.load()) {
      for (auto phase : {&Loop::Rebalance, &Loop::Fetch, &Loop::Publish, &Loop::Settle}) {
        IDEM_ASSIGN_OR_RETURN(Next next, (this->*phase)());
        if (next == Next::kDone) return Status::OK();
        if (next == Next::kAgain) break;
      }
    }
    return Status::OK();
  }

 private:
  // What a phase says of the turn: go on to the next phase, start the next
  // turn, or return from Run (stop_when_idle, drained).
  enum class Next { kProceed, kAgain, kDone };

  // A live session (its own connection) and, when due, a fair share of the
  // lanes (Rebalance: heartbeat, take, renew). Standby (no lane): waits.
  Result<Next> Rebalance() {
    const Options& o = r_.options_;
    if (session_ == nullptr || !session_->Alive()) {
      session_.reset();
      auto opened = r_.store_.OpenSession(name_);
      if (!opened.ok()) return StoreFailed(opened.status());
      session_ = std::move(*opened);
      next_rebalance_ = 0;
    }
    if (env_.NowMs() >= next_rebalance_) {
      auto held = session_->Rebalance();
      if (!held.ok()) return StoreFailed(held.status());
      lanes_ = *held;
      next_rebalance_ = env_.NowMs() + o.rebalance_ms;
      Update([&](OutboxRelayStats& st) { st.lanes = lanes_; });
      IDEM_KILL_POINT("relay.after_lock");
    }
    if (lanes_ > 0) return Next::kProceed;
    // Standby: another relay holds every lane.
    if (o.stop_when_idle && Drained()) return Next::kDone;
    (void)session_->Wait(std::min(o.poll_ms, o.rebalance_ms));
    if (o.stop_when_idle) next_rebalance_ = 0;
    return Next::kAgain;
  }

  // The lowest seq of the lanes held (Fetch); none: waits (Wait).
  Result<Next> Fetch() {
    const Options& o = r_.options_;
    republished_ = 0;
    fetch_start_ = std::chrono::steady_clock::now();
    auto fetched = session_->Fetch(o.batch, &republished_);
    if (!fetched.ok()) return StoreFailed(fetched.status());
    down_since_ = -1;
    rows_ = std::move(*fetched);
    now_ = env_.NowMs();
    Update([&](OutboxRelayStats& st) {
      st.backlog = static_cast<int64_t>(rows_.size());
      st.oldest_unsent_age_ms = rows_.empty() ? 0 : std::max<int64_t>(0, now_ - rows_.front().added_at_ms);
    });
    if (!rows_.empty()) {
      IDEM_KILL_POINT("relay.after_fetch");
      return Next::kProceed;
    }
    backoff_round_ = 0;
    if (o.stop_when_idle) {
      if (Drained()) return Next::kDone;
      env_.SleepMs(10);
      next_rebalance_ = 0;
      return Next::kAgain;
    }
    (void)session_->Wait(o.poll_ms);
    return Next::kAgain;
  }

  // Rounds of PublishBatch: a key's next row only after its previous
  // confirm (all of a key's rows in one round when traits().ordered_batch);
  // collects what the broker answered into settle_.
  Result<Next> Publish() {
    const Options& o = r_.options_;
    // Each key's rows in seq order (the fetch gives them so); a key with an
    // unsettled failure sends nothing more this round.
    std::map<std::string, std::vector<size_t>> by_key;
    for (size_t i = 0; i < rows_.size(); ++i)
      by_key[rows_[i].key.empty() ? "\x01" + rows_[i].id : rows_[i].key].push_back(i);
    std::vector<Message> messages;
    messages.reserve(rows_.size());
    for (const OutboxRow& r : rows_) messages.push_back(ToMessage(r));
    std::vector<size_t> next(by_key.size(), 0);
    std::vector<std::vector<size_t>*> keys;
    for (auto& [k, v] : by_key) keys.push_back(&v);
    std::vector<bool> blocked(keys.size(), false);
    settle_ = OutboxSettlement{};
    settle_.keep_sent = o.keep_sent;
    transient_ = 0;
    if (Status s = session_->NoteHanded(rows_); !s.ok()) return StoreFailed(s);
    store_us_ = MicrosSince(fetch_start_);
    publish_us_ = 0;
    for (;;) {
      // One round: with an ordered publisher every unblocked row, else the
      // next row of each unblocked key; at most max_batch.
      std::vector<size_t> round;
      for (size_t k = 0; k < keys.size() && round.size() < max_batch_; ++k) {
        if (blocked[k]) continue;
        auto& v = *keys[k];
        size_t take = traits_.ordered_batch ? v.size() - next[k] : std::min<size_t>(1, v.size() - next[k]);
        take = std::min(take, max_batch_ - round.size());
        for (size_t j = 0; j < take; ++j) round.push_back(v[next[k] + j]);
      }
      if (round.empty()) break;
      std::sort(round.begin(), round.end());  // seq order: a key's rows stay in order
      if (!session_->Alive()) break;          // lanes lost: hand over nothing more
      std::vector<Outgoing> out;
      out.reserve(round.size());
      for (size_t i : round) out.push_back(Outgoing{rows_[i].destination, rows_[i].key, &messages[i]});
      IDEM_KILL_POINT("relay.before_publish");
      const auto publish_start = std::chrono::steady_clock::now();
      std::vector<Status> answers = r_.publisher_.PublishBatch(out);
      publish_us_ += MicrosSince(publish_start);
      if (answers.size() != out.size())
        answers.assign(out.size(), Status::Internal("PublishBatch answered the wrong count"));
      IDEM_KILL_POINT("relay.after_publish");
      std::map<std::string_view, bool> failed_key;
      for (size_t j = 0; j < round.size(); ++j) {
        const OutboxRow& r = rows_[round[j]];
        const Status& s = answers[j];
        if (s.ok()) {
          settle_.sent.push_back(r.seq);
        } else if (Permanent(s) || (o.max_attempts > 0 && r.attempts + 1 >= o.max_attempts)) {
          settle_.dead.push_back(
              OutboxDeadLetter{r, Permanent(s) ? "refused" : "failed", std::string(s.message()), now_});
        } else {
          settle_.failed.emplace_back(r.seq, std::string(CodeName(s.code())) + ": " + std::string(s.message()));
          ++transient_;
          failed_key[r.key.empty() ? std::string_view(r.id) : std::string_view(r.key)] = true;
        }
      }
      // Advance each key past what this round settled; a transient failure
      // blocks its key until the next fetch.
      for (size_t k = 0; k < keys.size(); ++k) {
        if (blocked[k]) continue;
        auto& v = *keys[k];
        if (next[k] >= v.size()) continue;
        const OutboxRow& head = rows_[v[next[k]]];
        if (!std::binary_search(round.begin(), round.end(), v[next[k]])) continue;
        if (failed_key.count(head.key.empty() ? std::string_view(head.id) : std::string_view(head.key))) {
          blocked[k] = true;
          continue;
        }
        while (next[k] < v.size() && std::binary_search(round.begin(), round.end(), v[next[k]])) ++next[k];
      }
    }
    return Next::kProceed;
  }

  // Settle in one transaction: sent, refused (dead letters), transient
  // (attempts + 1, then a backoff).
  Result<Next> Settle() {
    const Options& o = r_.options_;
    IDEM_KILL_POINT("relay.before_settle");
    settle_.now_ms = env_.NowMs();
    const auto settle_start = std::chrono::steady_clock::now();
    Status settled = session_->Settle(settle_);
    store_us_ += MicrosSince(settle_start);
    Update([&](OutboxRelayStats& st) {
      st.store_us += store_us_;
      st.publish_us += publish_us_;
    });
    // Nothing settled: every row is published again (same id), later.
    if (!settled.ok()) return StoreFailed(settled);
    IDEM_KILL_POINT("relay.after_settle");
    if (o.observer != nullptr) r_.Notify(rows_, settle_, republished_);
    Update([&](OutboxRelayStats& st) {
      st.published += settle_.sent.size();
      st.republished +=
          static_cast<uint64_t>(std::min<int64_t>(republished_, static_cast<int64_t>(settle_.sent.size())));
      st.dead_lettered += settle_.dead.size();
      st.transient_errors += static_cast<uint64_t>(transient_);
      ++st.rounds;
    });
    if (transient_ > 0) {
      env_.SleepMs(internal::JitteredBackoffMs(o.backoff_base_ms, o.backoff_max_ms, ++backoff_round_, env_));
    } else {
      backoff_round_ = 0;
    }
    return Next::kAgain;
  }

  // A store error: drop the session (its lanes go with its connection) and
  // try again after a backoff; give up (the error) once the store has been
  // unreachable for 20 polls.
  Result<Next> StoreFailed(const Status& s) {
    const Options& o = r_.options_;
    session_.reset();
    lanes_ = 0;
    Update([&](OutboxRelayStats& st) { st.lanes = 0; });
    const int64_t now = env_.NowMs();
    if (down_since_ < 0) down_since_ = now;
    if (now - down_since_ > o.poll_ms * 20) return s;
    env_.SleepMs(internal::JitteredBackoffMs(o.backoff_base_ms, o.backoff_max_ms, ++backoff_round_, env_));
    return Next::kAgain;
  }

  // Drained: nothing left in the whole outbox (lanes held elsewhere, or by
  // a relay that just died, are waited for).
  bool Drained() {
    auto unsent = r_.store_.HasUnsent();
    return unsent.ok() && !*unsent;
  }

  template <typename F>
  void Update(F&& f) {
    std::lock_guard lock(r_.state_->mu);
    f(r_.state_->stats);
  }

  OutboxRelay& r_;
  Env& env_;
  const std::string name_;
  const PublisherTraits traits_;
  const size_t max_batch_;
  std::unique_ptr<OutboxSession> session_;
  int64_t next_rebalance_ = 0, down_since_ = -1;
  int lanes_ = 0, backoff_round_ = 0;
  // This turn's: what Fetch found, what Publish collected.
  std::vector<OutboxRow> rows_;
  int64_t republished_ = 0, now_ = 0;
  std::chrono::steady_clock::time_point fetch_start_;
  OutboxSettlement settle_;
  int transient_ = 0;
  uint64_t store_us_ = 0, publish_us_ = 0;
};

Status OutboxRelay::Run() { return State::Loop(*this).Run(); }

void StopOnSignals(OutboxRelay* relay) { internal::StopOnSignalsOf(relay); }

}  // namespace idem
