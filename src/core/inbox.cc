// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/inbox.h"

#include "core/gate.h"
#include "core/handler_scope.h"
#include "core/kill_point.h"
#include "idem/call_first.h"
#include "idem/env.h"
#include "idem/prefilter.h"
#include "idem/trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>

namespace idem {

namespace internal {
namespace {
thread_local const std::string* t_write_lock = nullptr;
thread_local std::optional<Status> t_setup_refusal;
}  // namespace
HandlerScope::HandlerScope(const std::string& write_lock_id) : previous_(t_write_lock) {
  t_write_lock = write_lock_id.empty() ? nullptr : &write_lock_id;
}
HandlerScope::~HandlerScope() { t_write_lock = previous_; }
const std::string* HeldWriteLock() noexcept { return t_write_lock; }
void RefuseSetup(const Status& why) { t_setup_refusal = why; }
void ClearSetupRefusal() noexcept { t_setup_refusal.reset(); }
const Status* SetupRefusal() noexcept { return t_setup_refusal ? &*t_setup_refusal : nullptr; }
}  // namespace internal

std::string_view KindName(Outcome::Kind kind) {
  switch (kind) {
    case Outcome::Kind::kApplied: return "applied";
    case Outcome::Kind::kDuplicate: return "duplicate";
    case Outcome::Kind::kConflict: return "conflict";
    case Outcome::Kind::kFailed: return "failed";
  }
  return "unknown";
}

std::string Outcome::ToString() const {
  std::string s(KindName(kind));
  if (kind == Kind::kFailed) s += " (" + status.ToString() + ")";
  if (kind == Kind::kConflict)
    s += " (stored fingerprint " + ToHex(stored_fingerprint) + ", incoming " + ToHex(incoming_fingerprint) + ")";
  return s;
}

namespace {

// Runs of a batch whose commit found a marker committed meanwhile
// (Attempt::again), beyond one per message: each run finds at least one
// more of them, so the batch's size (and a few for racing commits) settles it.
constexpr size_t kMaxAgain = 4;

Outcome Failed(Status s) {
  Outcome o;
  o.kind = Outcome::Kind::kFailed;
  o.status = std::move(s);
  return o;
}

// What a handler's error means to the Consumer. kInProgress (a CallOnce step
// held elsewhere, or unfinished downstream) stays itself, and so does
// kInDoubt from a handler's own call, as in progress: the effect may exist,
// so the message is redelivered without counting a failure. kRejected (never
// retried) and kAborted (stopping) stay themselves. Any other error is the
// handler's failure, counted toward max_attempts.
Status HandlerStatus(Status s) {
  switch (s.code()) {
    case Code::kOk:
    case Code::kHandlerFailed:
    case Code::kInProgress:
    case Code::kRejected:
    case Code::kAborted: return s;
    case Code::kInDoubt:
      return Status::InProgress("a call may have taken effect and its outcome is not known yet: " + s.message());
    default: return Status::HandlerFailed(s.ToString());
  }
}

// Runs the user's handler; an exception becomes kHandlerFailed, so the caller
// always gets to roll back before anything else happens.
int64_t MonotonicUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Status RunHandler(const Handler& handler, Transaction& tx, const Message& m) {
  try {
    return HandlerStatus(handler(tx, m));
  } catch (const std::exception& e) {
    return Status::HandlerFailed(std::string("handler threw: ") + e.what());
  } catch (...) {
    return Status::HandlerFailed("handler threw an exception that is not a std::exception");
  }
}

}  // namespace

// The Inbox's state and steps, out of the header.
struct Inbox::Impl {
  Impl(Store& store, const Options& options);

  std::vector<Outcome> HandleBatch(std::span<const Message> messages, const Handler& handler);
  std::vector<Outcome> HandleBatch(std::span<const Message> messages, const CallFirst& handler);
  InboxCounters counters() const;

  struct Attempt {
    std::optional<size_t> failed{};  // the message whose handler failed
    Status status{};                 // its error
    // The commit found a marker another transaction committed meanwhile
    // and wrote nothing (a store whose markers are proved only at commit,
    // DynamoDB: Code::kDuplicate): the batch runs again and finds it.
    bool again = false;
  };
  // One transaction over the messages not excluded; stops at the first
  // handler failure (rolled back) and says which.
  Attempt TryBatch(std::span<const Message> messages, const Handler& handler, const std::vector<bool>& excluded,
                   std::vector<Outcome>& out);
  // After a commit reported kInDoubt: reads the markers of the messages whose
  // handler ran back, to learn whether the commit happened. Returns true
  // when every one of them was found (the batch committed).
  bool ResolveInDoubt(std::span<const Message> messages, const std::vector<bool>& pending,
                      std::vector<Outcome>& outcomes, const Status& s);
  void Count(const Outcome& o);
  // Tells Options::observer each outcome.
  void Notify(std::span<const Message> messages, const std::vector<Outcome>& out);
  // Validation and the pre-filter, before any transaction: fills `out` for
  // the messages it answers and excludes them. False when nothing can run
  // (every outcome is filled).
  bool Admit(std::span<const Message> messages, bool has_handler, std::vector<Outcome>& out,
             std::vector<bool>& excluded);
  // Transactions over the messages not excluded, until every handler that
  // fails has been left out (see HandleBatch).
  void Apply(std::span<const Message> messages, const Handler& handler, std::vector<bool>& excluded,
             std::vector<Outcome>& out);

  Store& store_;
  Options options_;
  const std::string write_lock_id_;  // store_.WriteLockId(), read once
  std::atomic<uint64_t> applied_{0}, duplicates_{0}, conflicts_{0}, failures_{0}, dead_lettered_{0};
  std::atomic<uint64_t> in_progress_{0}, rejected_{0};
};

namespace internal {
void InboxGate::NoteDeadLetter(Inbox& inbox) { inbox.impl_->dead_lettered_.fetch_add(1, std::memory_order_relaxed); }
}  // namespace internal

Inbox::Inbox(Store& store) : Inbox(store, Options{}) {}

Inbox::Inbox(Store& store, const Options& options) : impl_(std::make_unique<Impl>(store, options)) {}

Inbox::~Inbox() = default;

std::vector<Outcome> Inbox::HandleBatch(std::span<const Message> messages, const Handler& handler) {
  return impl_->HandleBatch(messages, handler);
}
std::vector<Outcome> Inbox::HandleBatch(std::span<const Message> messages, const CallFirst& handler) {
  return impl_->HandleBatch(messages, handler);
}
InboxCounters Inbox::counters() const { return impl_->counters(); }
Observer* Inbox::observer() const { return impl_->options_.observer; }
const std::string& Inbox::consumer() const { return impl_->options_.consumer; }
Store& Inbox::store() { return impl_->store_; }
Env* Inbox::env() const { return impl_->options_.env; }

Inbox::Impl::Impl(Store& store, const Options& options)
    : store_(store), options_(options), write_lock_id_(store.WriteLockId()) {
  if (options_.env == nullptr) options_.env = Env::Default();
}

Result<std::unique_ptr<Inbox>> Inbox::Open(Store& store) { return Open(store, Options{}); }

Result<std::unique_ptr<Inbox>> Inbox::Open(Store& store, const Options& options) {
  if (options.consumer.empty() || options.consumer.size() > kMaxIdBytes)
    return Status::InvalidArgument("Inbox::Options::consumer must be 1.." + std::to_string(kMaxIdBytes) +
                                   " bytes, got " + std::to_string(options.consumer.size()));
  return std::unique_ptr<Inbox>(new Inbox(store, options));
}

Outcome Inbox::Handle(const Message& message, const Handler& handler) {
  return HandleBatch(std::span<const Message>(&message, 1), handler).front();
}

Outcome Inbox::Handle(const Message& message, const CallFirst& handler) {
  return HandleBatch(std::span<const Message>(&message, 1), handler).front();
}

bool Inbox::Impl::Admit(std::span<const Message> messages, bool has_handler, std::vector<Outcome>& out,
                        std::vector<bool>& excluded) {
  excluded.assign(messages.size(), false);
  if (messages.empty()) return false;
  if (!has_handler) {  // a caller's mistake, not the message's: nothing is counted or dead-lettered
    for (auto& o : out) o = Failed(Status::InvalidArgument("Inbox: the handler is empty"));
    return false;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (Status s = ValidateId(messages[i].id); !s.ok()) {
      out[i] = Failed(s);
      excluded[i] = true;
    }
  }
  if (options_.prefilter != nullptr) {
    std::vector<bool> known = options_.prefilter->KnownApplied(options_.consumer, messages);
    for (size_t i = 0; i < messages.size() && i < known.size(); ++i) {
      if (excluded[i] || !known[i]) continue;
      out[i].kind = Outcome::Kind::kDuplicate;
      excluded[i] = true;
    }
  }
  return true;
}

std::vector<Outcome> Inbox::Impl::HandleBatch(std::span<const Message> messages, const Handler& handler) {
  std::vector<Outcome> out(messages.size());
  std::vector<bool> excluded;
  internal::ClearSetupRefusal();
  if (!Admit(messages, static_cast<bool>(handler), out, excluded)) return out;
  Apply(messages, handler, excluded, out);
  if (internal::SetupRefusal() != nullptr) return out;  // the set-up's failure, not the messages'
  for (auto& o : out) Count(o);
  Notify(messages, out);
  return out;
}

std::vector<Outcome> Inbox::Impl::HandleBatch(std::span<const Message> messages, const CallFirst& handler) {
  std::vector<Outcome> out(messages.size());
  std::vector<bool> excluded;
  internal::ClearSetupRefusal();
  if (!Admit(messages, handler.complete(), out, excluded)) return out;
  // A message handled before makes no call (its claims may be purged by
  // now): read its marker first. A conflict is left to the transaction,
  // which records it; its calls are not made either.
  std::vector<std::unique_ptr<Calls>> calls(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    if (excluded[i]) continue;
    const Message& m = messages[i];
    auto found =
        store_.FindMarker(options_.consumer, m.id, options_.key_by_producer_time ? m.producer_time_ms : std::nullopt);
    if (!found.ok()) {
      out[i] = Failed(found.status());
      excluded[i] = true;
      continue;
    }
    if (found->has_value()) {
      if ((*found)->fingerprint == FingerprintOf(m.payload)) {
        out[i].kind = Outcome::Kind::kDuplicate;
        excluded[i] = true;
      }
      continue;
    }
    calls[i] = std::make_unique<Calls>(handler.claims(), m);
    Status s;
    const TraceScope trace(TraceContext::Of(m));  // the calls continue the message's trace
    try {
      s = HandlerStatus(handler.calls()(*calls[i], m));
    } catch (const std::exception& e) {
      s = Status::HandlerFailed(std::string("calls threw: ") + e.what());
    } catch (...) {
      s = Status::HandlerFailed("calls threw an exception that is not a std::exception");
    }
    if (!s.ok()) {
      out[i] = Failed(std::move(s));
      excluded[i] = true;
    }
  }
  // The transactional part: the message's own Calls, found by its place in
  // the span (the Inbox hands the handler the span's elements).
  const Handler apply = [&](Transaction& tx, const Message& m) -> Status {
    const auto i = static_cast<size_t>(&m - messages.data());
    if (i >= messages.size() || calls[i] == nullptr)
      return Status::Internal("call-first: a message reached the transaction without its calls");
    return handler.apply()(tx, m, *calls[i]);
  };
  Apply(messages, apply, excluded, out);
  if (internal::SetupRefusal() != nullptr) return out;  // the set-up's failure, not the messages'
  for (auto& o : out) Count(o);
  Notify(messages, out);
  return out;
}

void Inbox::Impl::Apply(std::span<const Message> messages, const Handler& handler, std::vector<bool>& excluded,
                        std::vector<Outcome>& out) {
  // Optimistic: the whole batch in one transaction with no savepoints (on
  // PostgreSQL each would cost two round trips per message). When a handler
  // fails, the transaction is rolled back and the batch runs again without
  // that message (and its copies); the others' handlers run again then.
  std::vector<bool> shed = excluded;  // answered without the store's transaction
  for (size_t again = 0;;) {
    Attempt a = TryBatch(messages, handler, excluded, out);
    if (a.again && ++again <= messages.size() + kMaxAgain) continue;
    if (!a.failed.has_value()) break;
    if (a.status.code() == Code::kAborted) {
      // The consumer is stopping: the rest of the batch is given back with
      // it, unrun (nothing committed), rather than run again without it.
      for (size_t i = 0; i < messages.size(); ++i)
        if (!excluded[i])
          out[i] = Failed(i == *a.failed ? a.status : a.status.WithContext("given back with its batch"));
      break;
    }
    const std::string& id = messages[*a.failed].id;
    for (size_t i = 0; i < messages.size(); ++i) {
      if (excluded[i] || messages[i].id != id) continue;
      excluded[i] = true;
      out[i] = Failed(i == *a.failed ? a.status
                                     : Status::HandlerFailed("another copy of this message in the batch failed: " +
                                                             a.status.message()));
    }
  }
  if (options_.prefilter != nullptr) {
    std::vector<Message> committed;
    for (size_t i = 0; i < messages.size(); ++i)
      if (!shed[i] && (out[i].kind == Outcome::Kind::kApplied || out[i].kind == Outcome::Kind::kDuplicate))
        committed.push_back(messages[i]);
    if (!committed.empty()) options_.prefilter->Remember(options_.consumer, committed);
  }
}

Inbox::Impl::Attempt Inbox::Impl::TryBatch(std::span<const Message> messages, const Handler& handler,
                                           const std::vector<bool>& excluded, std::vector<Outcome>& out) {
  const int64_t now = options_.env->NowMs();
  std::vector<size_t> index;  // markers[k] belongs to messages[index[k]]
  std::vector<Marker> markers;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (excluded[i]) continue;
    out[i] = Outcome{};
    index.push_back(i);
    markers.push_back(Marker{options_.consumer, messages[i].id, FingerprintOf(messages[i].payload), now,
                             options_.key_by_producer_time ? messages[i].producer_time_ms : std::nullopt});
  }
  if (markers.empty()) return {};
  auto fail_all = [&](const Status& s) {
    for (size_t i : index) out[i] = Failed(s);
    return Attempt{};
  };

  auto tx_or = store_.BeginDeferred();  // BEGIN goes with the markers where the store can
  if (!tx_or.ok()) return fail_all(tx_or.status());
  StoreTransaction& tx = **tx_or;
  IDEM_KILL_POINT("inbox.before_marker");
  // All markers go in with one call (one statement where the store can).
  auto existing = tx.InsertMarkers(markers);
  if (!existing.ok()) return fail_all(existing.status());
  if (existing->size() != markers.size()) return fail_all(Status::Internal("InsertMarkers answered the wrong count"));

  std::vector<bool> pending(messages.size(), false);  // applied if the commit succeeds
  for (size_t k = 0; k < markers.size(); ++k) {
    const size_t i = index[k];
    const Message& m = messages[i];
    const Marker& marker = markers[k];
    if (markers.size() > 1 && k == markers.size() / 2) IDEM_KILL_POINT("inbox.batch_mid");
    if ((*existing)[k].has_value()) {
      const Fingerprint& stored = *(*existing)[k];
      if (stored == marker.fingerprint) {
        out[i].kind = Outcome::Kind::kDuplicate;
      } else {
        out[i].kind = Outcome::Kind::kConflict;
        out[i].stored_fingerprint = stored;
        out[i].incoming_fingerprint = marker.fingerprint;
        DeadLetter letter{options_.consumer,
                          m.id,
                          "conflict",
                          "id reused for a different payload: stored fingerprint " + ToHex(stored) + ", incoming " +
                              ToHex(marker.fingerprint),
                          m.attempt,
                          m.payload,
                          now};
        if (Status s = tx.PutDeadLetter(letter); !s.ok()) {
          tx.Rollback();
          return fail_all(s);
        }
      }
      continue;
    }
    IDEM_KILL_POINT("inbox.after_marker");
    Status hs;
    {
      internal::HandlerScope scope(write_lock_id_);
      const TraceScope trace(TraceContext::Of(m));  // what the handler calls and adds continues the trace
      const int64_t t0 = options_.observer != nullptr ? MonotonicUs() : 0;
      hs = RunHandler(handler, tx, m);
      if (const Status* refused = internal::SetupRefusal()) {
        // Whatever the handler made of it: no message can ever apply so.
        tx.Rollback();
        return fail_all(*refused);
      }
      // In a batch, this handler's later inserts go now: their error is
      // this message's, not the next one's.
      if (hs.ok() && markers.size() > 1) hs = tx.FlushLater();
      if (options_.observer != nullptr) out[i].handler_us = MonotonicUs() - t0;
    }
    if (!hs.ok() && !tx.Healthy()) {
      // The connection died under the handler: the store failed, not the
      // message. Nothing is committed; every message is delivered again.
      tx.Rollback();
      return fail_all(Status::Unavailable("the store connection was lost while a handler ran (" + hs.message() + ")"));
    }
    if (!hs.ok()) {
      tx.Rollback();
      for (size_t j : index) out[j] = Outcome{};
      return Attempt{i, hs};
    }
    pending[i] = true;
  }

  IDEM_KILL_POINT("inbox.after_work");
  const int64_t commit_t0 = options_.observer != nullptr ? MonotonicUs() : 0;
  Status cs = tx.Commit();
  if (options_.observer != nullptr) {
    const int64_t commit_us = MonotonicUs() - commit_t0;
    for (size_t i : index) out[i].commit_us = commit_us;
  }
  if (cs.code() == Code::kInDoubt) {
    for (size_t i : index)
      if (pending[i]) out[i] = Failed(cs);  // until the marker says otherwise
    const bool committed = ResolveInDoubt(messages, pending, out, cs);
    // A duplicate may have been judged against a marker this very batch
    // inserted (the same id twice in one batch), and a conflict's dead letter
    // went in with the batch: acknowledging them is safe only if the batch
    // committed. Without pending markers to prove it, the duplicates were
    // judged against earlier commits, but a conflict's dead letter is in doubt.
    // A duplicate is acknowledged only once its marker is read back as well:
    // a store that counts a commit only when a standby has it (PostgreSQL's
    // ack_after = standby_flush) is in doubt about the marker found too.
    for (size_t i : index) {
      if (pending[i]) continue;
      const bool conflict = out[i].kind == Outcome::Kind::kConflict;
      if (!committed && (conflict || std::any_of(pending.begin(), pending.end(), [](bool p) { return p; }))) {
        out[i] = Failed(cs.WithContext("the batch's commit did not happen, so this copy is not acknowledged either"));
      } else if (!conflict) {
        auto found = store_.FindMarker(options_.consumer, messages[i].id,
                                       options_.key_by_producer_time ? messages[i].producer_time_ms : std::nullopt);
        if (!found.ok() || !found->has_value())
          out[i] = Failed(cs.WithContext("a duplicate whose marker could not be read back (" +
                                         (found.ok() ? std::string("not found") : found.status().ToString()) +
                                         ") is not acknowledged"));
      }
    }
  } else if (cs.code() == Code::kDuplicate) {
    // Nothing of the transaction is saved, and a marker of it exists now:
    // run again (Apply), where it is a duplicate before any handler runs.
    fail_all(cs);
    return Attempt{.again = true};
  } else if (!cs.ok()) {
    // Nothing of the transaction is saved. Duplicates and conflicts found in
    // it are still true, but a conflict's dead letter was not written, so
    // every message must be delivered again.
    return fail_all(cs);
  } else {
    for (size_t i : index)
      if (pending[i]) out[i].kind = Outcome::Kind::kApplied;
  }
  IDEM_KILL_POINT("inbox.after_commit");
  return {};
}

bool Inbox::Impl::ResolveInDoubt(std::span<const Message> messages, const std::vector<bool>& pending,
                                 std::vector<Outcome>& out, const Status& s) {
  bool all_present = false;
  bool any_absent = false;
  // The commit may or may not have happened. Never retry blindly: read each
  // marker back on a fresh connection. Present means the effect is committed
  // (by us, or by a racing consumer): safe to acknowledge.
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!pending[i]) continue;
    auto found = store_.FindMarker(options_.consumer, messages[i].id,
                                   options_.key_by_producer_time ? messages[i].producer_time_ms : std::nullopt);
    const bool present = found.ok() && found->has_value();
    if (!found.ok()) {
      any_absent = true;
      out[i] = Failed(
          s.WithContext("commit outcome unknown and the marker could not be read (" + found.status().ToString() + ")"));
    } else if (!present) {
      any_absent = true;
      out[i] = Failed(
          s.WithContext("no committed marker found after it, so it is treated as not committed and not acknowledged"));
    } else {
      all_present = true;
      out[i].kind = Outcome::Kind::kApplied;
    }
    if (options_.observer != nullptr) {
      Event e;
      e.kind = present ? EventKind::kInDoubtCommitted : EventKind::kInDoubtNotCommitted;
      e.consumer = options_.consumer;
      e.message_id = messages[i].id;
      e.attempt = messages[i].attempt;
      e.detail = s.message();
      e.at_ms = options_.env->NowMs();
      options_.observer->OnEvent(e);
    }
  }
  return all_present && !any_absent;
}

void Inbox::Impl::Notify(std::span<const Message> messages, const std::vector<Outcome>& out) {
  Observer* obs = options_.observer;
  if (obs == nullptr) return;
  const int64_t now = options_.env->NowMs();
  for (size_t i = 0; i < out.size() && i < messages.size(); ++i) {
    const Outcome& o = out[i];
    const Message& m = messages[i];
    Event e;
    switch (o.kind) {
      case Outcome::Kind::kApplied: e.kind = EventKind::kApplied; break;
      case Outcome::Kind::kDuplicate: e.kind = EventKind::kDuplicate; break;
      case Outcome::Kind::kConflict: e.kind = EventKind::kConflict; break;
      case Outcome::Kind::kFailed:
        e.kind = o.status.code() == Code::kInProgress ? EventKind::kInProgress
                 : o.status.code() == Code::kRejected ? EventKind::kRejected
                 : o.status.code() == Code::kAborted  ? EventKind::kAborted
                                                      : EventKind::kFailed;
        break;
    }
    e.consumer = options_.consumer;
    e.message_id = m.id;
    e.attempt = m.attempt;
    e.handler_us = o.handler_us;
    e.commit_us = o.commit_us;
    if (o.kind == Outcome::Kind::kFailed) e.detail = o.status.message();
    if (auto tp = m.Header("traceparent")) e.traceparent = *tp;
    e.at_ms = now;
    obs->OnEvent(e);
  }
}

void Inbox::Impl::Count(const Outcome& o) {
  switch (o.kind) {
    case Outcome::Kind::kApplied: applied_.fetch_add(1, std::memory_order_relaxed); break;
    case Outcome::Kind::kDuplicate: duplicates_.fetch_add(1, std::memory_order_relaxed); break;
    case Outcome::Kind::kConflict: conflicts_.fetch_add(1, std::memory_order_relaxed); break;
    case Outcome::Kind::kFailed:
      if (o.status.code() == Code::kInProgress) {
        in_progress_.fetch_add(1, std::memory_order_relaxed);
      } else if (o.status.code() == Code::kRejected) {
        rejected_.fetch_add(1, std::memory_order_relaxed);
      } else if (o.status.code() != Code::kAborted) {  // a stopping consumer's: no failure
        failures_.fetch_add(1, std::memory_order_relaxed);
      }
      break;
  }
}

InboxCounters Inbox::Impl::counters() const {
  return {applied_.load(),       duplicates_.load(),  conflicts_.load(), failures_.load(),
          dead_lettered_.load(), in_progress_.load(), rejected_.load()};
}

}  // namespace idem
