// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/consumer.h"
#include "core/kill_point.h"

#include "idem/env.h"
#include "idem/observer.h"

#include "core/backoff.h"
#include "core/gate.h"
#include "core/handler_scope.h"
#include "core/saturating.h"
#include "core/signal_stop.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace idem {

namespace {
// The stop flag of the Consumer whose worker runs on this thread.
thread_local const std::atomic<bool>* t_stop_flag = nullptr;
}  // namespace

// The runner's state and workers, out of the header.
struct Consumer::Impl {
  Impl(Source& source, Inbox& inbox, Handler handler, const Options& options);
  Impl(Source& source, Inbox& inbox, CallFirst handler, const Options& options);

  Status Run();
  void Stop() noexcept { stop_.store(true, std::memory_order_relaxed); }
  bool stopping() const noexcept { return stop_.load(std::memory_order_relaxed); }
  ConsumerStats stats() const;

  // A failure recorded for a message id within the batch being settled.
  struct BatchFailure {
    int attempts = 0;
    bool dead_lettered = false;
  };
  using BatchFailures = std::unordered_map<std::string, BatchFailure>;

  // What a worker holds while its handlers run, for the lease keeper.
  struct Held {
    std::mutex mu;
    const std::vector<Delivery>* deliveries = nullptr;  // guarded by mu
    int64_t renewed_at_ms = 0;                          // guarded by mu
  };

  void Work(Held* held);
  // Renews the leases of what the workers hold until Run() ends.
  // How a Run() call tells its lease keeper to end: one per call, so that
  // Run() calls on several threads (idem run's workers) never end or keep
  // each other's keepers.
  struct KeeperSignal {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;  // guarded by mu
  };
  void KeepLeases(std::vector<std::unique_ptr<Held>>* held, KeeperSignal* signal);
  std::vector<Outcome> HandleAll(std::span<const Message> messages);
  // `batch_failures`: failures already recorded in this batch, so that copies
  // of one message in one batch count one failure, not one each.
  // `deferred_acks`: where a delivery to acknowledge is noted instead (the
  // batch's acks go out together, Source::AckBatch); null: acked at once.
  void Settle(const Delivery& d, const Outcome& o, BatchFailures* batch_failures = nullptr,
              std::vector<size_t>* deferred_acks = nullptr, size_t index = 0);
  // Drain mode: whether a worker whose Receive began at `receive_started_ms`
  // and found nothing may return.
  bool IdleDone(int64_t receive_started_ms);
  void NoteRetryDue(int64_t due_ms);
  // A delivery past max_deliveries: dead-lettered (or acked, if applied);
  // false when it must be handled after all (it is in progress).
  bool SettleCrashLoop(const Delivery& d);
  // Records an in-progress outcome and gives the delivery back.
  void SettleInProgress(const Delivery& d, const Outcome& o);
  // Records a rejection (dead letter) and acknowledges.
  void SettleRejected(const Delivery& d, const Outcome& o);
  void Ack(const Delivery& d);
  // What follows an ack (or its failure): counters, events, kill point.
  void NoteAck(const Delivery& d, const Status& s);
  // Acknowledges (*got)[i] for each i of `indices`, in one Source::AckBatch.
  void AckBatch(const std::vector<Delivery>& got, const std::vector<size_t>& indices);
  // Tells the Inbox's observer (Inbox::Options::observer), if any.
  void Emit(EventKind kind, const Delivery& d, std::string_view detail = {}, int64_t handler_us = -1);

  Source& source_;
  Inbox& inbox_;
  Handler handler_;
  std::optional<CallFirst> call_first_;
  Options options_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> received_{0}, acked_{0}, nacked_{0}, dead_{0}, ack_errors_{0}, receive_errors_{0};
  std::atomic<uint64_t> in_progress_{0}, parked_{0}, rejected_{0}, leases_extended_{0}, lease_errors_{0};
  // Wakes the lease keeper when Run() ends.
  // Workers between a non-empty Receive and the end of its Settle.
  std::atomic<int> busy_{0};
  // The latest time a message this consumer nacked becomes visible again.
  std::atomic<int64_t> retry_due_ms_{0};
  // Ids whose failure this process recorded and that are not yet cleared:
  // their count must be cleared when a copy applies, whatever its attempt.
  std::mutex failed_mu_;
  std::unordered_set<std::string> failed_ids_;
};

Consumer::Consumer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Consumer::Consumer(Source& source, Inbox& inbox, Handler handler)
    : Consumer(std::make_unique<Impl>(source, inbox, std::move(handler), Options{})) {}

Consumer::Consumer(Source& source, Inbox& inbox, CallFirst handler)
    : Consumer(std::make_unique<Impl>(source, inbox, std::move(handler), Options{})) {}

Status Consumer::Run() { return impl_->Run(); }
void Consumer::Stop() noexcept { impl_->Stop(); }
bool Consumer::stopping() const noexcept { return impl_->stopping(); }
ConsumerStats Consumer::stats() const { return impl_->stats(); }

Consumer::Impl::Impl(Source& source, Inbox& inbox, Handler handler, const Options& options)
    : source_(source), inbox_(inbox), handler_(std::move(handler)), options_(options) {
  if (options_.env == nullptr) options_.env = Env::Default();
}

Consumer::Impl::Impl(Source& source, Inbox& inbox, CallFirst handler, const Options& options)
    : source_(source), inbox_(inbox), call_first_(std::move(handler)), options_(options) {
  if (options_.env == nullptr) options_.env = Env::Default();
}

namespace {
Status CheckOptions(const Consumer::Options& o) {
  const auto bad = [](const char* what, int64_t v) {
    return Status::InvalidArgument(std::string("Consumer::Options::") + what + " cannot be " + std::to_string(v));
  };
  if (o.workers < 1) return bad("workers", o.workers);
  if (o.batch < 1) return bad("batch", o.batch);
  if (o.max_attempts < 0) return bad("max_attempts", o.max_attempts);  // 0: never
  if (o.max_deliveries < 0) return bad("max_deliveries", o.max_deliveries);
  if (o.backoff_base_ms < 0) return bad("backoff_base_ms", o.backoff_base_ms);
  if (o.backoff_max_ms < 0) return bad("backoff_max_ms", o.backoff_max_ms);
  if (o.receive_wait_ms < 0) return bad("receive_wait_ms", o.receive_wait_ms);
  if (o.park_after_ms < 0) return bad("park_after_ms", o.park_after_ms);
  return Status::OK();
}
}  // namespace

Result<std::unique_ptr<Consumer>> Consumer::Open(Source& source, Inbox& inbox, Handler handler,
                                                 const Options& options) {
  IDEM_RETURN_IF_ERROR(CheckOptions(options));
  if (!handler) return Status::InvalidArgument("Consumer::Open: the handler is empty");
  return std::unique_ptr<Consumer>(new Consumer(std::make_unique<Impl>(source, inbox, std::move(handler), options)));
}

Result<std::unique_ptr<Consumer>> Consumer::Open(Source& source, Inbox& inbox, CallFirst handler,
                                                 const Options& options) {
  IDEM_RETURN_IF_ERROR(CheckOptions(options));
  if (!handler.complete()) return Status::InvalidArgument("Consumer::Open: the CallFirst has an empty function");
  return std::unique_ptr<Consumer>(new Consumer(std::make_unique<Impl>(source, inbox, std::move(handler), options)));
}

Consumer::~Consumer() {
  // A signal after this must not reach a destroyed consumer (StopOnSignals).
  internal::DetachFromSignals(this);
}

Status Consumer::Impl::Run() {
  if (call_first_ ? !call_first_->complete() : !handler_)
    return Status::InvalidArgument("Consumer: the handler is empty");
  std::vector<std::unique_ptr<Held>> held;
  held.reserve(static_cast<size_t>(options_.workers));
  for (int i = 0; i < options_.workers; ++i) held.push_back(std::make_unique<Held>());
  KeeperSignal keeper_signal;
  std::thread keeper;
  if (options_.extend_leases && source_.lease_ms() > 0) {
    try {
      keeper = std::thread([this, &held, &keeper_signal] { KeepLeases(&held, &keeper_signal); });
    } catch (const std::system_error& e) {
      return Status::Unavailable(std::string("cannot start the lease keeper thread: ") + e.what());
    }
  }
  const auto stop_keeper = [&] {
    {
      std::lock_guard<std::mutex> l(keeper_signal.mu);
      keeper_signal.done = true;
    }
    keeper_signal.cv.notify_all();
    if (keeper.joinable()) keeper.join();
  };
  // A set-up that can never work, met by a worker (internal::RefuseSetup):
  // what Run() returns.
  std::mutex refused_mu;
  Status refused;
  const auto work = [&](Held* h) {
    Work(h);
    if (const Status* r = internal::SetupRefusal()) {
      std::lock_guard<std::mutex> l(refused_mu);
      if (refused.ok())
        refused = r->WithContext(
            "Consumer stopped: a set-up that can never work (the delivery was given back, "
            "no failure counted)");
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < options_.workers; ++i) {
    try {
      threads.emplace_back([&work, h = held[i].get()] { work(h); });
    } catch (const std::system_error& e) {
      // The system has no thread for this worker: stop the ones started
      // (each finishes or gives back what it holds) and say why.
      Stop();
      for (auto& t : threads) t.join();
      stop_keeper();
      return Status::Unavailable("cannot start worker " + std::to_string(i + 1) + " of " +
                                 std::to_string(options_.workers) + ": " + e.what());
    }
  }
  work(held[0].get());
  for (auto& t : threads) t.join();
  stop_keeper();
  return refused;
}

void Consumer::Impl::KeepLeases(std::vector<std::unique_ptr<Held>>* held, KeeperSignal* signal) {
  const int64_t lease = source_.lease_ms();
  // Renew once a third of the lease has passed since the last renewal (or
  // the receive), checking six times a lease so a renewal is never late by
  // more than a sixth of it.
  const int64_t every = std::max<int64_t>(1, lease / 3);
  const auto tick = std::chrono::milliseconds(std::clamp<int64_t>(lease / 6, 5, 1000));
  std::unique_lock<std::mutex> l(signal->mu);
  while (!signal->cv.wait_for(l, tick, [signal] { return signal->done; })) {
    l.unlock();
    for (auto& h : *held) {
      std::lock_guard<std::mutex> hl(h->mu);
      if (h->deliveries == nullptr) continue;
      const int64_t now = options_.env->NowMs();
      if (now - h->renewed_at_ms < every) continue;
      for (const Delivery& d : *h->deliveries) {
        const Status extended = source_.ExtendLease(d);
        if (extended.ok()) {
          leases_extended_.fetch_add(1, std::memory_order_relaxed);
          Emit(EventKind::kLeaseExtended, d);
        } else {
          if (extended.code() == Code::kLeaseLost) IDEM_KILL_POINT("consumer.lease_lost");
          // Lost (another worker may hold it now: the marker settles the
          // race) or the source failed: either way nothing to undo here.
          lease_errors_.fetch_add(1, std::memory_order_relaxed);
          Emit(EventKind::kLeaseLost, d, extended.message());
        }
      }
      h->renewed_at_ms = options_.env->NowMs();
    }
    l.lock();
  }
}

std::vector<Outcome> Consumer::Impl::HandleAll(std::span<const Message> messages) {
  if (messages.size() == 1) {
    return {call_first_ ? inbox_.Handle(messages.front(), *call_first_) : inbox_.Handle(messages.front(), handler_)};
  }
  return call_first_ ? inbox_.HandleBatch(messages, *call_first_) : inbox_.HandleBatch(messages, handler_);
}

namespace {
// The one backoff (core/backoff.h), with this consumer's settings.
int64_t Backoff(const Consumer::Options& o, int attempt, Env* env) {
  return internal::JitteredBackoffMs(o.backoff_base_ms, o.backoff_max_ms, attempt, *env);
}

using internal::SaturatingAdd;
}  // namespace

void Consumer::Impl::NoteRetryDue(int64_t due_ms) {
  int64_t cur = retry_due_ms_.load();
  while (cur < due_ms && !retry_due_ms_.compare_exchange_weak(cur, due_ms)) {
  }
}

bool Consumer::Impl::IdleDone(int64_t receive_started_ms) {
  // Another worker may still nack what it holds: it decides for itself when
  // it comes back idle.
  if (busy_.load() > 0) return false;
  // A retry this consumer gave back is not "nothing": wait until a whole
  // Receive began after it was due. (The check on busy_ comes first: a worker
  // notes its retry before it stops being busy.)
  const int64_t due = retry_due_ms_.load();
  if (receive_started_ms >= due) return true;
  // Wait on the consumer's own clock too, so that drain mode ends even when
  // the source keeps another clock.
  const int64_t now = options_.env->NowMs();
  if (due > now) options_.env->SleepMs(std::min<int64_t>(due - now, std::max<int64_t>(1, options_.receive_wait_ms)));
  return false;
}

void Consumer::Impl::Work(Held* held) {
  internal::ClearSetupRefusal();
  t_stop_flag = &stop_;
  struct ClearStopFlag {
    ~ClearStopFlag() { t_stop_flag = nullptr; }
  } clear_stop_flag;
  std::vector<Message> messages;
  int receive_errors_in_a_row = 0;
  while (!stopping()) {
    const int64_t started = options_.env->NowMs();
    auto got = source_.Receive(options_.batch, options_.receive_wait_ms);
    if (!got.ok()) {
      receive_errors_.fetch_add(1, std::memory_order_relaxed);
      // Back off by this worker's run of consecutive errors, not by the
      // lifetime total: one error after a long healthy stretch waits briefly.
      receive_errors_in_a_row = std::min(receive_errors_in_a_row + 1, 8);
      options_.env->SleepMs(Backoff(options_, receive_errors_in_a_row, options_.env));
      continue;
    }
    receive_errors_in_a_row = 0;
    if (got->empty()) {
      if (options_.stop_when_idle && IdleDone(started)) return;
      continue;
    }
    busy_.fetch_add(1);
    received_.fetch_add(got->size(), std::memory_order_relaxed);
    for (const Delivery& d : *got) Emit(EventKind::kReceived, d);
    // Gives every delivery back unacknowledged, at once, and ends this worker.
    const auto give_back = [&] {
      for (const Delivery& d : *got) {
        (void)source_.Nack(d, 0);
        nacked_.fetch_add(1, std::memory_order_relaxed);
        Emit(EventKind::kNacked, d);
      }
      busy_.fetch_sub(1);
    };
    if (stopping()) return give_back();  // received but not started
    if (options_.max_deliveries > 0) {
      // Past the broker's delivery limit: never handled again (see
      // Consumer::Options::max_deliveries), unless it is in progress.
      std::erase_if(
          *got, [&](const Delivery& d) { return d.message.attempt > options_.max_deliveries && SettleCrashLoop(d); });
      if (got->empty()) {
        busy_.fetch_sub(1);
        continue;
      }
    }
    if (options_.id_from) {
      // The id from the payload or a header; none: dead-lettered at once.
      std::erase_if(*got, [&](Delivery& d) {
        auto id = options_.id_from->Extract(d.message);
        if (id.ok()) {
          d.message.id = std::move(*id);
          return false;
        }
        Outcome o;
        o.status = Status::Rejected(id.status().message());
        SettleRejected(d, o);
        return true;
      });
      if (got->empty()) {
        busy_.fetch_sub(1);
        continue;
      }
    }
    {
      std::lock_guard<std::mutex> l(held->mu);
      held->deliveries = &*got;
      held->renewed_at_ms = started;  // the lease began at the Receive
    }
    IDEM_KILL_POINT("consumer.after_receive");
    messages.clear();
    for (const Delivery& d : *got) messages.push_back(d.message);
    std::vector<Outcome> outcomes = HandleAll(messages);
    int64_t renewed_at_ms = started;
    {
      // Settled deliveries need no lease: stop renewing before the acks.
      std::lock_guard<std::mutex> l(held->mu);
      held->deliveries = nullptr;
      renewed_at_ms = held->renewed_at_ms;
    }
    if (internal::SetupRefusal() != nullptr) {
      // The set-up can never work (internal::RefuseSetup): no message's
      // failure. Nothing committed; everything goes back and Run() returns it.
      Stop();
      return give_back();
    }
    // Handled past its lease, unrenewed: another consumer may have been
    // given the message meanwhile (the seed's cause of a rise in skipped
    // duplicates). Told to the observer with how long it took.
    if (const int64_t lease = source_.lease_ms(); lease > 0 && inbox_.observer() != nullptr) {
      const int64_t now = options_.env->NowMs();
      if (now - renewed_at_ms > lease)
        for (const Delivery& d : *got) Emit(EventKind::kLeaseOverrun, d, {}, (now - started) * 1000);
    }
    BatchFailures batch_failures;
    std::vector<size_t> deferred_acks;
    const bool batched = outcomes.size() > 1;
    for (size_t i = 0; i < outcomes.size(); ++i)
      Settle((*got)[i], outcomes[i], batched ? &batch_failures : nullptr, batched ? &deferred_acks : nullptr, i);
    AckBatch(*got, deferred_acks);
    busy_.fetch_sub(1);
  }
}

void Consumer::Impl::Emit(EventKind kind, const Delivery& d, std::string_view detail, int64_t handler_us) {
  Observer* obs = inbox_.observer();
  if (obs == nullptr) return;
  Event e;
  e.kind = kind;
  e.consumer = inbox_.consumer();
  e.message_id = d.message.id;
  e.attempt = d.message.attempt;
  e.handler_us = handler_us;
  e.detail = detail;
  if (auto tp = d.message.Header("traceparent")) e.traceparent = *tp;
  e.at_ms = options_.env->NowMs();
  obs->OnEvent(e);
}

void Consumer::Impl::Ack(const Delivery& d) { NoteAck(d, source_.Ack(d)); }

void Consumer::Impl::AckBatch(const std::vector<Delivery>& got, const std::vector<size_t>& indices) {
  if (indices.empty()) return;
  std::vector<Delivery> subset;
  std::span<const Delivery> acked(got);
  if (indices.size() != got.size()) {
    subset.reserve(indices.size());
    for (size_t i : indices) subset.push_back(got[i]);
    acked = subset;
  }
  std::vector<Status> st = source_.AckBatch(acked);
  for (size_t k = 0; k < acked.size(); ++k)
    NoteAck(acked[k], k < st.size() ? st[k] : Status::Internal("Source::AckBatch answered too few deliveries"));
}

void Consumer::Impl::NoteAck(const Delivery& d, const Status& s) {
  if (s.ok()) {
    acked_.fetch_add(1, std::memory_order_relaxed);
    Emit(EventKind::kAcked, d);
    IDEM_KILL_POINT("consumer.after_ack");
  } else {
    // The effect is committed (or the message is dead-lettered); the
    // redelivery finds the marker (or the dead letter's count).
    if (s.code() == Code::kLeaseLost) IDEM_KILL_POINT("consumer.lease_lost");
    ack_errors_.fetch_add(1, std::memory_order_relaxed);
    Emit(EventKind::kAckFailed, d, s.message());
  }
}

void Consumer::Impl::SettleRejected(const Delivery& d, const Outcome& o) {
  FailureRecord rec{
      inbox_.consumer(), &d.message, o.status.message(), 1, options_.env->NowMs(), FailureRecord::Kind::kRejected};
  auto count = inbox_.store().RecordFailure(rec);
  if (!count.ok()) {  // the store is down: the verdict is not recorded yet
    (void)source_.Nack(d, Backoff(options_, std::max(1, d.message.attempt), options_.env));
    nacked_.fetch_add(1, std::memory_order_relaxed);
    Emit(EventKind::kNacked, d);
    return;
  }
  {
    std::lock_guard<std::mutex> l(failed_mu_);
    failed_ids_.erase(d.message.id);
  }
  if (count->dead_lettered) {
    dead_.fetch_add(1, std::memory_order_relaxed);
    Emit(EventKind::kDeadLettered, d, rec.error);
    rejected_.fetch_add(1, std::memory_order_relaxed);
    internal::InboxGate::NoteDeadLetter(inbox_);
  }
  Ack(d);  // rejected now, or applied by another delivery meanwhile
}

void Consumer::Impl::SettleInProgress(const Delivery& d, const Outcome& o) {
  in_progress_.fetch_add(1, std::memory_order_relaxed);
  FailureRecord rec{
      inbox_.consumer(),     &d.message, o.status.message(), 0, options_.env->NowMs(), FailureRecord::Kind::kInProgress,
      options_.park_after_ms};
  auto count = inbox_.store().RecordFailure(rec);
  if (count.ok() && count->already_applied) {
    Ack(d);
    return;
  }
  if (count.ok()) {
    std::lock_guard<std::mutex> l(failed_mu_);
    failed_ids_.insert(d.message.id);  // its row must be cleared when it applies
  }
  if (count.ok() && count->parked) {
    parked_.fetch_add(1, std::memory_order_relaxed);
    Emit(EventKind::kParked, d, rec.error);
  }
  // In progress: try again after the backoff of its delivery count; once
  // parked (or when the count is unknown), at the slowest pace.
  const bool slow = !count.ok() || count->parked;
  const int64_t delay =
      slow ? options_.backoff_max_ms : Backoff(options_, std::max(1, d.message.attempt), options_.env);
  (void)source_.Nack(d, delay);
  NoteRetryDue(SaturatingAdd(options_.env->NowMs(), delay));
  nacked_.fetch_add(1, std::memory_order_relaxed);
  Emit(EventKind::kNacked, d);
}

void Consumer::Impl::Settle(const Delivery& d, const Outcome& o, BatchFailures* batch_failures,
                            std::vector<size_t>* deferred_acks, size_t index) {
  auto ack = [&] {
    if (deferred_acks != nullptr)
      deferred_acks->push_back(index);
    else
      Ack(d);
  };
  auto forget_failed = [&](const std::string& id) {
    std::lock_guard<std::mutex> l(failed_mu_);
    return failed_ids_.erase(id) > 0;
  };
  auto nack = [&](int attempt, bool failure_recorded) {
    const int64_t delay = Backoff(options_, attempt, options_.env);
    Status ns = source_.Nack(d, delay);
    if (ns.code() == Code::kLeaseLost && failure_recorded) {
      // The lease ran out while the handler failed: another delivery of the
      // message may have applied it, and cleared its count, before this
      // failure was recorded. Then the count is stale: clear it again.
      auto marker = inbox_.store().FindMarker(inbox_.consumer(), d.message.id, d.message.producer_time_ms);
      if (marker.ok() && marker->has_value()) {
        forget_failed(d.message.id);
        (void)inbox_.store().ClearFailures(inbox_.consumer(), d.message.id);
      }
    }
    // Read the clock after the Nack: the source counts the delay from its
    // own "now" during the call, never later than this one. (Still inside
    // the busy window, so an idle worker sees this before it may return.)
    NoteRetryDue(SaturatingAdd(options_.env->NowMs(), delay));
    nacked_.fetch_add(1, std::memory_order_relaxed);
    Emit(EventKind::kNacked, d);
  };
  if (o.ShouldAck()) {
    // The message is done (applied now, or earlier by another delivery): its
    // failure count, if it has one, is forgotten. A first delivery may need
    // this too, when another copy of the message failed before; a source
    // that does not count deliveries (attempt 0) always does.
    if (o.kind != Outcome::Kind::kConflict) {
      const bool failed_here = forget_failed(d.message.id);
      if (failed_here || d.message.attempt != 1) (void)inbox_.store().ClearFailures(inbox_.consumer(), d.message.id);
    }
    ack();
    return;
  }
  if (o.status.code() == Code::kInProgress) return SettleInProgress(d, o);
  if (o.status.code() == Code::kRejected) return SettleRejected(d, o);
  if (o.status.code() == Code::kAborted) {  // stopping: given back at once, nothing counted
    (void)source_.Nack(d, 0);
    nacked_.fetch_add(1, std::memory_order_relaxed);
    Emit(EventKind::kNacked, d);
    return;
  }
  const bool handler_failed = o.status.code() == Code::kHandlerFailed;
  const bool bad_id = o.status.code() == Code::kInvalidArgument && !ValidateId(d.message.id).ok();
  int attempt = std::max(1, d.message.attempt);
  bool failure_recorded = false;
  if (handler_failed && batch_failures != nullptr) {
    // Another copy of this message in the same batch failed already (the
    // inbox fails the later copies without running the handler): one
    // failure, recorded once. The copy shares its fate.
    if (auto it = batch_failures->find(d.message.id); it != batch_failures->end()) {
      if (it->second.dead_lettered) {
        ack();
        return;
      }
      nack(it->second.attempts, false);
      return;
    }
  }
  if (handler_failed || bad_id) {
    // The failure count is written in a transaction of its own: the handler's
    // rollback has already happened and must not erase it.
    Message keyed = d.message;
    if (bad_id) keyed.id = "(invalid id; receipt " + d.receipt + ")";
    FailureRecord rec{inbox_.consumer(), &keyed, o.status.ToString(), bad_id ? 1 : options_.max_attempts,
                      options_.env->NowMs()};
    auto count = inbox_.store().RecordFailure(rec);
    if (count.ok() && count->already_applied) {
      // Another delivery applied the message meanwhile: it is done.
      forget_failed(d.message.id);
      ack();
      return;
    }
    if (count.ok()) {
      failure_recorded = !bad_id;
      attempt = count->attempts;
      if (count->parked) {
        parked_.fetch_add(1, std::memory_order_relaxed);
        Emit(EventKind::kParked, d);
      }
      if (handler_failed && batch_failures != nullptr)
        (*batch_failures)[d.message.id] = BatchFailure{count->attempts, count->dead_lettered};
      if (count->dead_lettered) {
        if (!bad_id) forget_failed(d.message.id);
        // An invalid id's count is keyed by this delivery's receipt: nothing
        // could ever clear it later.
        if (bad_id) (void)inbox_.store().ClearFailures(inbox_.consumer(), keyed.id);
        dead_.fetch_add(1, std::memory_order_relaxed);
        Emit(EventKind::kDeadLettered, d, rec.error);
        internal::InboxGate::NoteDeadLetter(inbox_);
        ack();
        return;
      }
      if (!bad_id) {
        std::lock_guard<std::mutex> l(failed_mu_);
        failed_ids_.insert(d.message.id);
      }
    }
  }
  nack(attempt, failure_recorded);
}

bool Consumer::Impl::SettleCrashLoop(const Delivery& d) {
  const std::string error = "delivered " + std::to_string(d.message.attempt) +
                            " times without an outcome (the consumer may crash while handling it); max_deliveries " +
                            std::to_string(options_.max_deliveries);
  FailureRecord rec{
      inbox_.consumer(), &d.message, error, /*max_attempts=*/1, options_.env->NowMs(), FailureRecord::Kind::kCrashLoop};
  auto count = inbox_.store().RecordFailure(rec);
  if (!count.ok()) {  // the store is down: try again later
    (void)source_.Nack(d, Backoff(options_, 1, options_.env));
    nacked_.fetch_add(1, std::memory_order_relaxed);
    Emit(EventKind::kNacked, d);
    return true;
  }
  // In progress: its deliveries reached an outcome (each was given back
  // while a step was unfinished), so this is no crash loop. Handle it.
  if (count->in_progress) return false;
  if (count->dead_lettered) {
    dead_.fetch_add(1, std::memory_order_relaxed);
    Emit(EventKind::kDeadLettered, d, error);
    internal::InboxGate::NoteDeadLetter(inbox_);
  }
  // Applied earlier (its acks were lost) or dead-lettered now: done either way.
  Ack(d);
  return true;
}

ConsumerStats Consumer::Impl::stats() const {
  return {received_.load(),   acked_.load(),           nacked_.load(),      dead_.load(),
          ack_errors_.load(), receive_errors_.load(),  in_progress_.load(), parked_.load(),
          rejected_.load(),   leases_extended_.load(), lease_errors_.load()};
}

bool StopRequested() noexcept {
  const std::atomic<bool>* f = t_stop_flag;
  return f != nullptr && f->load(std::memory_order_relaxed);
}

void StopOnSignals(Consumer* consumer) { internal::StopOnSignalsOf(consumer); }

}  // namespace idem
