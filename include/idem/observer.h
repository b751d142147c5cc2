// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Observer: everything a run does, one event per call, for a service's own
// logs, metrics and alerts. Set one on Inbox::Options::observer (the Consumer
// that runs that Inbox reports to it too), Outbox::Options::observer and
// OutboxRelay::Options::observer. Without one, nothing is built or timed.
//
//   idem::Metrics metrics;                        // idem/metrics.h
//   auto inbox = idem::Inbox::Open(store, {.consumer = "payments", .observer = &metrics});
//   ...  GET /metrics -> metrics.Render()
//
// OnEvent runs on the thread that did the work (a Consumer's worker, the
// relay's thread), inside no transaction and holding no idem lock: keep it
// short, never block, never throw. It may be called from several threads at
// once. The views in an Event live only for the call.
#ifndef IDEM_OBSERVER_H_
#define IDEM_OBSERVER_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace idem {

enum class EventKind {
  // The Inbox, one per message handled (Inbox::Handle, HandleBatch).
  kApplied,     // the effect committed; handler_us, commit_us set
  kDuplicate,   // the marker existed: work skipped (count these: see kLeaseOverrun)
  kConflict,    // the id came again with another payload: skipped, dead-lettered
  kFailed,      // nothing committed; detail: the error (a stopping consumer's: kAborted)
  kInProgress,  // a step no transaction covers is unfinished: redelivered, no failure counted
  kRejected,    // the handler said the message can never be handled
  // The Consumer, one per delivery.
  kReceived,
  kAcked,
  kAckFailed,      // the Ack failed after a commit (the redelivery is absorbed)
  kNacked,         // given back for a retry after a failure or an unfinished step, or at a stop
  kDeadLettered,   // detail: the reason (the error the dead-letter table keeps)
  kParked,         // in progress past park_after_ms: listed for an operator, still redelivered
  kLeaseExtended,  // the lease renewed while the handler ran
  kLeaseLost,      // a renewal failed: another consumer may have the message
  kLeaseOverrun,   // settled after its lease had run out unrenewed: another consumer may
                   // have handled it too (its copy counts as a duplicate); handler_us: how long
  // The outbox.
  kOutboxAdded,         // Outbox::Add in a transaction (committed or not: it is the caller's)
  kOutboxPublished,     // the broker confirmed it and the relay recorded it
  kOutboxRepublished,   // published again after a relay stopped between confirm and record
  kOutboxDeadLettered,  // refused for good, or failed max_attempts times; detail: why
  kOutboxTransientError,
  // The Inbox: a commit whose outcome was unknown (the connection died in
  // COMMIT), read back from the marker: committed, or not (redelivered).
  kInDoubtCommitted,
  kInDoubtNotCommitted,
  // Claims (Claims::Options::observer; the HTTP middleware's and CallOnce's
  // claims): message_id is the key, consumer the scope.
  kClaimStarted,     // the key is the caller's: it does the work
  kClaimTakenOver,   // the same, after another holder's lease ran out
  kClaimReplayed,    // done before: the stored result is replayed, no second execution
  kClaimInProgress,  // another holder's lease is live
  kClaimConflict,    // the key came again with another fingerprint
  kClaimCompleted,   // the result (or a stored error) was recorded
  kClaimReleased,    // given up without a result: the next claim runs the work
  kClaimFenced,      // the holder's lease had been taken over: its write was refused
  // The Inbox: the handler (or a call-first message's calls) gave up because
  // its Consumer is stopping (Status::Aborted, e.g. from idem::http::Client
  // at SIGTERM): nothing committed, the delivery is given back. Not a
  // failure: not counted, not an attempt toward dead-lettering.
  kAborted,
};

// How many kinds there are (the last one's value + 1), for arrays indexed by kind.
inline constexpr std::size_t kEventKinds = static_cast<std::size_t>(EventKind::kAborted) + 1;

// "applied", "duplicate", ..., "claim_fenced": the name in logs and in
// metric names.
std::string_view EventKindName(EventKind kind);

struct Event {
  EventKind kind = EventKind::kApplied;
  // The consumer's name (Inbox, Consumer), the relay's (outbox events
  // from a relay; "" from Outbox::Add), or the claims' scope.
  std::string_view consumer{};
  std::string_view message_id{};
  // The delivery count of the source (0 where it keeps none).
  int attempt = 0;
  // kApplied and the Inbox's other outcomes: how long the handler ran, and
  // the transaction's commit (shared by a batch). -1: not measured.
  int64_t handler_us = -1;
  int64_t commit_us = -1;
  // An error, a dead letter's reason, a destination.
  std::string_view detail{};
  // The message's W3C trace context, when it carries one.
  std::string_view traceparent{};
  int64_t at_ms = 0;  // the Env's clock
};

class Observer {
 public:
  virtual ~Observer() = default;
  virtual void OnEvent(const Event& event) noexcept = 0;
};

}  // namespace idem

#endif  // IDEM_OBSERVER_H_
