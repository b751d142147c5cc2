// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/consumer.h"

#include "core/saturating.h"

#include <signal.h>

#include <algorithm>
#include <limits>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace idem {

namespace {
// The stop flag of the Consumer whose worker runs on this thread.
thread_local const std::atomic<bool>* t_stop_flag = nullptr;
}  // namespace

Consumer::Consumer(Source& source, Inbox& inbox, Handler handler, ConsumerOptions options)
    : source_(source), inbox_(inbox), handler_(std::move(handler)), options_(std::move(options)) {
  if (options_.env == nullptr) options_.env = Env::Default();
}

namespace {
Status CheckOptions(const ConsumerOptions& o) {
  const auto bad = [](const char* what, int64_t v) {
    return Status::InvalidArgument(std::string("ConsumerOptions::") + what + " cannot be " + std::to_string(v));
  };
  if (o.workers < 1) return bad("workers", o.workers);
  if (o.batch < 1) return bad("batch", o.batch);
  if (o.max_attempts < 0) return bad("max_attempts", o.max_attempts);  // 0: never
  if (o.max_deliveries < 0) return bad("max_deliveries", o.max_deliveries);
  if (o.backoff_base_ms < 0) return bad("backoff_base_ms", o.backoff_base_ms);
  if (o.backoff_max_ms < 0) return bad("backoff_max_ms", o.backoff_max_ms);
  if (o.receive_wait_ms < 0) return bad("receive_wait_ms", o.receive_wait_ms);
  return Status::OK();
}
}  // namespace

Status Consumer::Run() {
  if (!handler_) return Status::InvalidArgument("Consumer: the handler is empty");
  IDEM_RETURN_IF_ERROR(CheckOptions(options_));
  std::vector<std::thread> threads;
  for (int i = 1; i < options_.workers; ++i) {
    try {
      threads.emplace_back([this] { Work(); });
    } catch (const std::system_error& e) {
      // The system has no thread for this worker: stop the ones started
      // (each finishes or gives back what it holds) and say why.
      Stop();
      for (auto& t : threads) t.join();
      return Status::Unavailable("cannot start worker " + std::to_string(i + 1) + " of " +
                                 std::to_string(options_.workers) + ": " + e.what());
    }
  }
  Work();
  for (auto& t : threads) t.join();
  return Status::OK();
}

namespace {
// base * 2^(attempt-1), at most max, plus up to 25% jitter. Saturates instead
// of overflowing when base or max are huge.
int64_t Backoff(const ConsumerOptions& o, int attempt, Env* env) {
  const int shift = std::clamp(attempt - 1, 0, 62);
  const int64_t base = std::max<int64_t>(0, o.backoff_base_ms);
  const int64_t max = std::max<int64_t>(0, o.backoff_max_ms);
  int64_t d = base > (max >> shift) ? max : std::min(max, base << shift);
  if (d > 0) {
    const int64_t jitter = static_cast<int64_t>(env->Random() % static_cast<uint64_t>(d / 4 + 1));
    d = d > std::numeric_limits<int64_t>::max() - jitter ? std::numeric_limits<int64_t>::max() : d + jitter;
  }
  return d;
}

using internal::SaturatingAdd;
}  // namespace

void Consumer::NoteRetryDue(int64_t due_ms) {
  int64_t cur = retry_due_ms_.load();
  while (cur < due_ms && !retry_due_ms_.compare_exchange_weak(cur, due_ms)) {
  }
}

bool Consumer::IdleDone(int64_t receive_started_ms) {
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

void Consumer::Work() {
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
    if (stopping()) {
      // Received but not started: give back unacknowledged, at once.
      for (const Delivery& d : *got) {
        (void)source_.Nack(d, 0);
        nacked_.fetch_add(1, std::memory_order_relaxed);
      }
      busy_.fetch_sub(1);
      return;
    }
    if (options_.max_deliveries > 0) {
      // Past the broker's delivery limit: never handled again (see
      // ConsumerOptions::max_deliveries).
      std::erase_if(*got, [&](const Delivery& d) {
        if (d.message.attempt <= options_.max_deliveries) return false;
        SettleCrashLoop(d);
        return true;
      });
      if (got->empty()) {
        busy_.fetch_sub(1);
        continue;
      }
    }
    if (got->size() == 1) {
      Settle(got->front(), inbox_.Handle(got->front().message, handler_));
    } else {
      messages.clear();
      for (const Delivery& d : *got) messages.push_back(d.message);
      std::vector<Outcome> outcomes = inbox_.HandleBatch(messages, handler_);
      BatchFailures batch_failures;
      for (size_t i = 0; i < outcomes.size(); ++i) Settle((*got)[i], outcomes[i], &batch_failures);
    }
    busy_.fetch_sub(1);
  }
}

void Consumer::Settle(const Delivery& d, const Outcome& o, BatchFailures* batch_failures) {
  auto ack = [&] {
    Status s = source_.Ack(d);
    if (s.ok()) {
      acked_.fetch_add(1, std::memory_order_relaxed);
      IDEM_KILL_POINT("consumer.after_ack");
    } else {
      // The effect is committed; the redelivery will find the marker.
      ack_errors_.fetch_add(1, std::memory_order_relaxed);
    }
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
      if (handler_failed && batch_failures != nullptr)
        (*batch_failures)[d.message.id] = BatchFailure{count->attempts, count->dead_lettered};
      if (count->dead_lettered) {
        if (!bad_id) forget_failed(d.message.id);
        // An invalid id's count is keyed by this delivery's receipt: nothing
        // could ever clear it later.
        if (bad_id) (void)inbox_.store().ClearFailures(inbox_.consumer(), keyed.id);
        dead_.fetch_add(1, std::memory_order_relaxed);
        inbox_.NoteDeadLetter();
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

void Consumer::SettleCrashLoop(const Delivery& d) {
  const std::string error = "delivered " + std::to_string(d.message.attempt) +
                            " times without an outcome (the consumer may crash while handling it); max_deliveries " +
                            std::to_string(options_.max_deliveries);
  FailureRecord rec{inbox_.consumer(), &d.message, error, /*max_attempts=*/1, options_.env->NowMs()};
  auto count = inbox_.store().RecordFailure(rec);
  if (!count.ok()) {  // the store is down: try again later
    (void)source_.Nack(d, Backoff(options_, 1, options_.env));
    nacked_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (count->dead_lettered) {
    dead_.fetch_add(1, std::memory_order_relaxed);
    inbox_.NoteDeadLetter();
  }
  // Applied earlier (its acks were lost) or dead-lettered now: done either way.
  if (source_.Ack(d).ok()) {
    acked_.fetch_add(1, std::memory_order_relaxed);
  } else {
    ack_errors_.fetch_add(1, std::memory_order_relaxed);
  }
}

ConsumerStats Consumer::stats() const {
  return {received_.load(), acked_.load(), nacked_.load(), dead_.load(), ack_errors_.load(), receive_errors_.load()};
}

bool StopRequested() noexcept {
  const std::atomic<bool>* f = t_stop_flag;
  return f != nullptr && f->load(std::memory_order_relaxed);
}

namespace {
std::atomic<Consumer*> g_signal_consumer{nullptr};
extern "C" void IdemStopHandler(int) {
  if (Consumer* c = g_signal_consumer.load()) c->Stop();
}
}  // namespace

void StopOnSignals(Consumer* consumer) {
  g_signal_consumer.store(consumer);
  struct sigaction sa {};
  sa.sa_handler = consumer ? IdemStopHandler : SIG_DFL;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace idem
