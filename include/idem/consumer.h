// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Consumer: the runner that joins a Source to an Inbox. Worker threads pull
// deliveries, hand them to the Inbox, and acknowledge a delivery only after
// its transaction committed (or when it can never apply: a duplicate or a
// conflict). A failed delivery is given back with exponential backoff; after
// max_attempts failures it goes to the dead-letter table with its last error
// and is acknowledged. The failure count is kept outside the business
// transaction, so the rollback of a failing handler does not erase it.
//
// Three outcomes are not failures:
//  - in progress (Code::kInProgress, or kInDoubt from a handler: a step no
//    transaction covers may have taken effect and is not finished, here or
//    downstream, e.g. an Idempotency-Key server answering 409): the message
//    is redelivered after a backoff and no failure is counted. Once a step
//    of a message may have taken effect, that message is never dead-lettered
//    as a failure; if it stays unfinished for park_after_ms it is parked:
//    listed with the dead letters (reason "parked", naming the step and its
//    key), counted, and still redelivered every backoff_max_ms until it
//    applies (the parked entry is then removed). Never dropped.
//  - rejected (Status::Rejected from the handler: the message can never be
//    handled): dead-lettered at once, reason "rejected", never retried.
//  - aborted (the consumer is stopping: a handler gave up, Status::Aborted,
//    and the rest of its batch): given back at once, not counted, told as
//    EventKind::kAborted.
//
// Leases: while a handler runs, the leases of its deliveries are renewed
// (Source::ExtendLease) every third of the source's lease, so no other
// worker gets the message meanwhile.
//
// Thread safety: Run() once; Stop() from any thread or a signal handler.
#ifndef IDEM_CONSUMER_H_
#define IDEM_CONSUMER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "idem/call_first.h"
#include "idem/id_from.h"
#include "idem/inbox.h"
#include "idem/result.h"
#include "idem/signals.h"
#include "idem/source.h"
#include "idem/status.h"

namespace idem {

class Env;

struct ConsumerStats {
  uint64_t received = 0;
  uint64_t acked = 0;
  uint64_t nacked = 0;
  uint64_t dead_lettered = 0;
  uint64_t ack_errors = 0;  // Ack failed after a commit (redelivery absorbs it)
  uint64_t receive_errors = 0;
  uint64_t in_progress = 0;  // given back in progress, no failure counted
  uint64_t parked = 0;       // messages parked (in progress past park_after_ms)
  uint64_t rejected = 0;     // dead-lettered at once by Status::Rejected (also in dead_lettered)
  uint64_t leases_extended = 0;
  uint64_t lease_extension_errors = 0;  // ExtendLease failed (kLeaseLost: another worker may have it)
};

class Consumer {
 public:
  struct Options {
    // Worker threads, each with its own store connection. Default: 1.
    int workers = 1;
    // Deliveries per Receive, handled in one transaction. Default: 1.
    int batch = 1;
    // Handler failures before a message is dead-lettered. 0: never. Default: 5.
    int max_attempts = 5;
    // Deliveries (the source's count, Message::attempt) after which a message
    // that never reached an outcome is dead-lettered without running the
    // handler: a message that crashes the consumer every time records no
    // failure, so only the broker's count can stop the crash loop. A message
    // whose marker exists (applied; its acks were lost) is acknowledged
    // instead. 0: off. Sources without a count (Kafka: 0) are unaffected.
    // Default: 20.
    int max_deliveries = 20;
    // Backoff after a failure: base * 2^(attempt-1), at most max, plus up to
    // 25% jitter. Defaults: 100 ms, 30 s.
    int64_t backoff_base_ms = 100;
    int64_t backoff_max_ms = 30'000;
    // How long one Receive waits for messages. Default: 200 ms.
    int64_t receive_wait_ms = 200;
    // Return from Run() once a Receive finds nothing (drain mode, for demos,
    // tests and batch jobs) and no worker is busy and no retry this consumer
    // gave back (a nack with backoff) is still due. Default: false (run until
    // Stop()).
    bool stop_when_idle = false;
    // How long a message may stay in progress (a step that may have taken
    // effect, not finished) before it is parked for an operator (see above).
    // 0: never parked. Default: 1 hour.
    int64_t park_after_ms = 3'600'000;
    // Renew the leases of deliveries whose handler runs long (see above).
    // Default: true.
    bool extend_leases = true;
    // Default (nullptr): Env::Default().
    Env* env = nullptr;
    // Take each delivery's id from its payload or a header (idem/id_from.h:
    // IdFrom::Parse("json:/order/id")) instead of the source's id field,
    // before the Inbox sees it. A delivery without it is dead-lettered at
    // once (reason "rejected", under the source's id) and acknowledged.
    // Default: none (the source's id).
    std::optional<IdFrom> id_from{};
  };

  // Checks the options (kInvalidArgument naming the field and the value:
  // workers or batch below 1, a negative count, backoff or wait), then makes
  // the runner. `source` and `inbox` must outlive it. The call-first form
  // (idem/call_first.h): each message's calls run before its transaction
  // opens.
  static Result<std::unique_ptr<Consumer>> Open(Source& source, Inbox& inbox, Handler handler, const Options& options);
  static Result<std::unique_ptr<Consumer>> Open(Source& source, Inbox& inbox, CallFirst handler,
                                                const Options& options);
  // With the default options (valid by construction).
  Consumer(Source& source, Inbox& inbox, Handler handler);
  Consumer(Source& source, Inbox& inbox, CallFirst handler);
  // Detaches StopOnSignals if it names this consumer.
  ~Consumer();
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // Runs the workers until Stop() (or idle, with stop_when_idle). In-flight
  // deliveries finish (commit, then ack) or are given back unacknowledged.
  // kInvalidArgument, before anything is received, for an empty handler;
  // kInvalidArgument naming the fix, at the first delivery that meets it, for
  // a set-up that can never work (CallOnce in a Handler with its claims in
  // the inbox's own SQLite file: idem/claims.h): the workers stop as on
  // Stop(), that delivery is given back, no failure is counted and nothing is
  // dead-lettered. Returns OK on a clean stop; kUnavailable when the system
  // will not start a worker thread (the workers already started stop first).
  Status Run();
  // Asks Run() to return. Async-signal-safe.
  void Stop() noexcept;
  bool stopping() const noexcept;

  // The counters so far, each read atomically (not one snapshot of all);
  // callable from any thread while Run() runs.
  ConsumerStats stats() const;

 private:
  struct Impl;  // the workers, the lease keeper and the counters (consumer.cc)
  explicit Consumer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Makes SIGINT and SIGTERM call consumer->Stop() (idem/signals.h: other
// objects attached stop too; the handlers before the first attach come back
// when the last one is detached). Pass nullptr to detach every object; the
// Consumer's destructor detaches it.
void StopOnSignals(Consumer* consumer);

// True when the calling thread runs a handler for a Consumer that is
// stopping. A handler that waits or retries should give up then (return
// Status::Aborted): idem::http::Client stops retrying, so a stopping
// Consumer ends within one request timeout. False outside a Consumer.
bool StopRequested() noexcept;

}  // namespace idem

#endif  // IDEM_CONSUMER_H_
