// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/consumer.h"

#include <signal.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

namespace idem {

Consumer::Consumer(Source& source, Inbox& inbox, Handler handler, ConsumerOptions options)
    : source_(source), inbox_(inbox), handler_(std::move(handler)), options_(std::move(options)) {
  if (options_.env == nullptr) options_.env = Env::Default();
  options_.workers = std::max(1, options_.workers);
  options_.batch = std::max(1, options_.batch);
}

Status Consumer::Run() {
  std::vector<std::thread> threads;
  for (int i = 1; i < options_.workers; ++i) threads.emplace_back([this] { Work(); });
  Work();
  for (auto& t : threads) t.join();
  return Status::OK();
}

namespace {
int64_t Backoff(const ConsumerOptions& o, int attempt, Env* env) {
  int shift = std::clamp(attempt - 1, 0, 30);
  int64_t d = std::min<int64_t>(o.backoff_max_ms, o.backoff_base_ms << shift);
  if (d > 0) d += static_cast<int64_t>(env->Random() % static_cast<uint64_t>(d / 4 + 1));
  return d;
}
}  // namespace

void Consumer::Work() {
  std::vector<Message> messages;
  while (!stopping()) {
    auto got = source_.Receive(options_.batch, options_.receive_wait_ms);
    if (!got.ok()) {
      receive_errors_.fetch_add(1, std::memory_order_relaxed);
      options_.env->SleepMs(Backoff(options_, static_cast<int>(std::min<uint64_t>(receive_errors_.load(), 8)),
                                    options_.env));
      continue;
    }
    if (got->empty()) {
      if (options_.stop_when_idle) return;
      continue;
    }
    received_.fetch_add(got->size(), std::memory_order_relaxed);
    if (stopping()) {
      // Received but not started: give back unacknowledged, at once.
      for (const Delivery& d : *got) {
        (void)source_.Nack(d, 0);
        nacked_.fetch_add(1, std::memory_order_relaxed);
      }
      return;
    }
    if (got->size() == 1) {
      Settle(got->front(), inbox_.Handle(got->front().message, handler_));
      continue;
    }
    messages.clear();
    for (const Delivery& d : *got) messages.push_back(d.message);
    std::vector<Outcome> outcomes = inbox_.HandleBatch(messages, handler_);
    for (size_t i = 0; i < outcomes.size(); ++i) Settle((*got)[i], outcomes[i]);
  }
}

void Consumer::Settle(const Delivery& d, const Outcome& o) {
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
  if (o.ShouldAck()) {
    if (o.applied() && d.message.attempt > 1) (void)inbox_.store().ClearFailures(inbox_.consumer(), d.message.id);
    ack();
    return;
  }
  const bool handler_failed = o.status.code() == Code::kHandlerFailed;
  const bool bad_id = o.status.code() == Code::kInvalidArgument && !ValidateId(d.message.id).ok();
  int attempt = std::max(1, d.message.attempt);
  if (handler_failed || bad_id) {
    // The failure count is written in a transaction of its own: the handler's
    // rollback has already happened and must not erase it.
    Message keyed = d.message;
    if (bad_id) keyed.id = "(invalid id; receipt " + d.receipt + ")";
    FailureRecord rec{inbox_.consumer(), &keyed, o.status.ToString(), bad_id ? 1 : options_.max_attempts,
                      options_.env->NowMs()};
    auto count = inbox_.store().RecordFailure(rec);
    if (count.ok()) {
      attempt = count->attempts;
      if (count->dead_lettered) {
        dead_.fetch_add(1, std::memory_order_relaxed);
        inbox_.NoteDeadLetter();
        ack();
        return;
      }
    }
  }
  (void)source_.Nack(d, Backoff(options_, attempt, options_.env));
  nacked_.fetch_add(1, std::memory_order_relaxed);
}

ConsumerStats Consumer::stats() const {
  return {received_.load(), acked_.load(), nacked_.load(), dead_.load(), ack_errors_.load(), receive_errors_.load()};
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
