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

Status OutboxRelay::Run() {
  Env& env = *options_.env;
  const std::string name = options_.name + ":" + std::to_string(::getpid()) + ":" +
                           std::to_string(reinterpret_cast<uintptr_t>(this) % 100000);
  const PublisherTraits traits = publisher_.traits();
  const size_t max_batch = static_cast<size_t>(std::max(1, traits.max_batch));
  std::unique_ptr<OutboxSession> session;
  int64_t next_rebalance = 0, down_since = -1;
  int lanes = 0, backoff_round = 0;
  auto update = [&](auto&& f) {
    std::lock_guard lock(state_->mu);
    f(state_->stats);
  };
  // A store error: drop the session (its lanes go with its connection) and
  // try again after a backoff; give up once the store has been unreachable
  // for 20 polls.
  auto store_failed = [&](const Status& s) -> Status {
    session.reset();
    lanes = 0;
    update([&](OutboxRelayStats& st) { st.lanes = 0; });
    const int64_t now = env.NowMs();
    if (down_since < 0) down_since = now;
    if (now - down_since > options_.poll_ms * 20) return s;
    env.SleepMs(internal::JitteredBackoffMs(options_.backoff_base_ms, options_.backoff_max_ms, ++backoff_round, env));
    return Status::OK();
  };
  while (!stop_.load()) {
    if (session == nullptr || !session->Alive()) {
      session.reset();
      auto opened = store_.OpenSession(name);
      if (!opened.ok()) {
        IDEM_RETURN_IF_ERROR(store_failed(opened.status()));
        continue;
      }
      session = std::move(*opened);
      next_rebalance = 0;
    }
    if (env.NowMs() >= next_rebalance) {
      auto held = session->Rebalance();
      if (!held.ok()) {
        IDEM_RETURN_IF_ERROR(store_failed(held.status()));
        continue;
      }
      lanes = *held;
      next_rebalance = env.NowMs() + options_.rebalance_ms;
      update([&](OutboxRelayStats& st) { st.lanes = lanes; });
      IDEM_KILL_POINT("relay.after_lock");
    }
    // Drained: nothing left in the whole outbox (lanes held elsewhere, or
    // by a relay that just died, are waited for).
    auto drained = [&]() {
      auto unsent = store_.HasUnsent();
      return unsent.ok() && !*unsent;
    };
    if (lanes == 0) {  // standby: another relay holds every lane
      if (options_.stop_when_idle && drained()) return Status::OK();
      (void)session->Wait(std::min(options_.poll_ms, options_.rebalance_ms));
      if (options_.stop_when_idle) next_rebalance = 0;
      continue;
    }
    int64_t republished = 0;
    const auto fetch_start = std::chrono::steady_clock::now();
    auto fetched = session->Fetch(options_.batch, &republished);
    if (!fetched.ok()) {
      IDEM_RETURN_IF_ERROR(store_failed(fetched.status()));
      continue;
    }
    down_since = -1;
    std::vector<OutboxRow>& rows = *fetched;
    const int64_t now = env.NowMs();
    update([&](OutboxRelayStats& st) {
      st.backlog = static_cast<int64_t>(rows.size());
      st.oldest_unsent_age_ms = rows.empty() ? 0 : std::max<int64_t>(0, now - rows.front().added_at_ms);
    });
    if (rows.empty()) {
      backoff_round = 0;
      if (options_.stop_when_idle) {
        if (drained()) return Status::OK();
        env.SleepMs(10);
        next_rebalance = 0;
        continue;
      }
      (void)session->Wait(options_.poll_ms);
      continue;
    }
    IDEM_KILL_POINT("relay.after_fetch");
    // Each key's rows in seq order (the fetch gives them so); a key with an
    // unsettled failure sends nothing more this round.
    std::map<std::string, std::vector<size_t>> by_key;
    for (size_t i = 0; i < rows.size(); ++i)
      by_key[rows[i].key.empty() ? "\x01" + rows[i].id : rows[i].key].push_back(i);
    std::vector<Message> messages;
    messages.reserve(rows.size());
    for (const OutboxRow& r : rows) messages.push_back(ToMessage(r));
    std::vector<size_t> next(by_key.size(), 0);
    std::vector<std::vector<size_t>*> keys;
    for (auto& [k, v] : by_key) keys.push_back(&v);
    std::vector<bool> blocked(keys.size(), false);
    OutboxSettlement settle;
    settle.keep_sent = options_.keep_sent;
    int transient = 0;
    if (Status s = session->NoteHanded(rows); !s.ok()) {
      IDEM_RETURN_IF_ERROR(store_failed(s));
      continue;
    }
    uint64_t store_us = MicrosSince(fetch_start), publish_us = 0;
    for (;;) {
      // One round: with an ordered publisher every unblocked row, else the
      // next row of each unblocked key; at most max_batch.
      std::vector<size_t> round;
      for (size_t k = 0; k < keys.size() && round.size() < max_batch; ++k) {
        if (blocked[k]) continue;
        auto& v = *keys[k];
        size_t take = traits.ordered_batch ? v.size() - next[k] : std::min<size_t>(1, v.size() - next[k]);
        take = std::min(take, max_batch - round.size());
        for (size_t j = 0; j < take; ++j) round.push_back(v[next[k] + j]);
      }
      if (round.empty()) break;
      std::sort(round.begin(), round.end());  // seq order: a key's rows stay in order
      if (!session->Alive()) break;           // lanes lost: hand over nothing more
      std::vector<Outgoing> out;
      out.reserve(round.size());
      for (size_t i : round) out.push_back(Outgoing{rows[i].destination, rows[i].key, &messages[i]});
      IDEM_KILL_POINT("relay.before_publish");
      const auto publish_start = std::chrono::steady_clock::now();
      std::vector<Status> answers = publisher_.PublishBatch(out);
      publish_us += MicrosSince(publish_start);
      if (answers.size() != out.size())
        answers.assign(out.size(), Status::Internal("PublishBatch answered the wrong count"));
      IDEM_KILL_POINT("relay.after_publish");
      std::map<std::string_view, bool> failed_key;
      for (size_t j = 0; j < round.size(); ++j) {
        const OutboxRow& r = rows[round[j]];
        const Status& s = answers[j];
        if (s.ok()) {
          settle.sent.push_back(r.seq);
        } else if (Permanent(s) || (options_.max_attempts > 0 && r.attempts + 1 >= options_.max_attempts)) {
          settle.dead.push_back(
              OutboxDeadLetter{r, Permanent(s) ? "refused" : "failed", std::string(s.message()), now});
        } else {
          settle.failed.emplace_back(r.seq, std::string(CodeName(s.code())) + ": " + std::string(s.message()));
          ++transient;
          failed_key[r.key.empty() ? std::string_view(r.id) : std::string_view(r.key)] = true;
        }
      }
      // Advance each key past what this round settled; a transient failure
      // blocks its key until the next fetch.
      for (size_t k = 0; k < keys.size(); ++k) {
        if (blocked[k]) continue;
        auto& v = *keys[k];
        if (next[k] >= v.size()) continue;
        const OutboxRow& head = rows[v[next[k]]];
        if (!std::binary_search(round.begin(), round.end(), v[next[k]])) continue;
        if (failed_key.count(head.key.empty() ? std::string_view(head.id) : std::string_view(head.key))) {
          blocked[k] = true;
          continue;
        }
        while (next[k] < v.size() && std::binary_search(round.begin(), round.end(), v[next[k]])) ++next[k];
      }
    }
    IDEM_KILL_POINT("relay.before_settle");
    settle.now_ms = env.NowMs();
    const auto settle_start = std::chrono::steady_clock::now();
    Status settled = session->Settle(settle);
    store_us += MicrosSince(settle_start);
    update([&](OutboxRelayStats& st) {
      st.store_us += store_us;
      st.publish_us += publish_us;
    });
    if (Status s = settled; !s.ok()) {
      // Nothing settled: every row is published again (same id), later.
      IDEM_RETURN_IF_ERROR(store_failed(s));
      continue;
    }
    IDEM_KILL_POINT("relay.after_settle");
    if (options_.observer != nullptr) Notify(rows, settle, republished);
    update([&](OutboxRelayStats& st) {
      st.published += settle.sent.size();
      st.republished += static_cast<uint64_t>(std::min<int64_t>(republished, static_cast<int64_t>(settle.sent.size())));
      st.dead_lettered += settle.dead.size();
      st.transient_errors += static_cast<uint64_t>(transient);
      ++st.rounds;
    });
    if (transient > 0) {
      env.SleepMs(internal::JitteredBackoffMs(options_.backoff_base_ms, options_.backoff_max_ms, ++backoff_round, env));
    } else {
      backoff_round = 0;
    }
  }
  return Status::OK();
}

void StopOnSignals(OutboxRelay* relay) { internal::StopOnSignalsOf(relay); }

}  // namespace idem
