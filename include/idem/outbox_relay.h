// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// OutboxRelay: publishes the committed messages of a store's outbox
// (idem/outbox.h) through a Publisher (idem/publisher.h, idem/open.h's
// OpenPublisher), and records each as sent only after the broker confirmed
// it. Run it on a thread of the service that adds to the outbox, or on its
// own (`idem relay`); several relays on one store share the work.
//
//   auto relay = idem::OutboxRelay::Open(*store, *publisher, {}).value();
//   std::thread t([&] { (void)relay->Run(); });   // until relay->Stop()
//
// Guarantees:
//  - At least once, never lost: a message leaves the outbox only after its
//    broker confirmed it; a crash in between publishes it again, same id,
//    same bytes (the next consumer's Inbox drops the copy).
//  - Order per ordering key, across crashes and relays: a message is handed
//    over only after every earlier message of its key was confirmed (or, on
//    a publisher whose batches keep order, in the same batch), and a key's
//    lane is held by one relay at a time. The lane is held by the relay's
//    database session, not by a lease: a relay paused while the server ended
//    that session (PostgreSQL) may, when it resumes, hand the rows it had
//    fetched to the broker once more after another relay took the lane. Those
//    are late duplicates (same id, seq), and the first copy of each message
//    still comes in key order; the paused relay's settle fails, so nothing it
//    records goes backwards (doc/outbox.md, doc/reliability.md).
//  - A message the broker refuses for good (PublishBatch's kInvalidArgument
//    or kRejected) goes to the outbox's dead letters with the reason, and
//    its key goes on; transient errors back off and try again.
//  - Woken by commits that add messages (in-process on SQLite, LISTEN/NOTIFY
//    on PostgreSQL), with a poll as the fallback.
//
// Thread safety: Run on one thread; Stop and stats from any.
#ifndef IDEM_OUTBOX_RELAY_H_
#define IDEM_OUTBOX_RELAY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "idem/env.h"
#include "idem/observer.h"
#include "idem/outbox_store.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/signals.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem {

struct OutboxRelayStats {
  uint64_t published = 0;            // confirmed by the broker
  uint64_t republished = 0;          // of those, handed over before (a crash or an unconfirmed try)
  uint64_t dead_lettered = 0;        // refused for good, or past max_attempts
  uint64_t transient_errors = 0;     // publish attempts that will be retried
  uint64_t rounds = 0;               // fetch-publish-settle rounds
  int lanes = 0;                     // lanes held now (0: standby)
  int64_t backlog = 0;               // unsent rows seen by the last fetch (at most batch)
  int64_t oldest_unsent_age_ms = 0;  // at the last fetch; 0 when empty
  // Where the rounds' time went (steady clock, summed): waiting on the
  // outbox's store (fetch and settle) and on the publisher (PublishBatch,
  // its confirms included).
  uint64_t store_us = 0;
  uint64_t publish_us = 0;
};

class OutboxRelay {
 public:
  struct Options {
    // Shown by `idem inspect` and in metrics; made unique per process.
    std::string name = "relay";
    // Rows fetched per round (1..10000).
    int batch = 500;
    // While the outbox is empty: how long to wait for a wake-up before
    // looking again anyway.
    int64_t poll_ms = 500;
    // Keep sent messages for retention (purged by Outbox::Purge / idem
    // purge) or delete them once confirmed.
    bool keep_sent = true;
    // Transient failures of one message before it is dead-lettered
    // ("failed"); 0: retry for ever.
    int max_attempts = 0;
    // Backoff after a round with transient failures.
    int64_t backoff_base_ms = 100;
    int64_t backoff_max_ms = 10'000;
    // How often lanes are rebalanced among relays.
    int64_t rebalance_ms = 1'000;
    // Return from Run once the outbox is empty (tests, drains, the demo).
    bool stop_when_idle = false;
    Env* env = nullptr;  // null: Env::Default()
    // Optional: told each message published, republished, dead-lettered or
    // failed for now (idem/observer.h). Must outlive the relay.
    Observer* observer = nullptr;
  };

  // kInvalidArgument when the store has no outbox or an option is out of
  // range.
  static Result<std::unique_ptr<OutboxRelay>> Open(Store& store, Publisher& publisher, const Options& options);
  // Detaches StopOnSignals if it names this relay.
  ~OutboxRelay();

  // Publishes until Stop() (or, with stop_when_idle, until nothing is left).
  // Errors: only a store that cannot be reached for Options::poll_ms * 20
  // or a first session that cannot open; broker errors are retried.
  Status Run();
  // Asks Run to return after the round in flight (async-signal-safe).
  void Stop() noexcept { stop_.store(true); }
  OutboxRelayStats stats() const;

 private:
  OutboxRelay(OutboxStore& store, Publisher& publisher, const Options& options);
  // Tells Options::observer what a settled round did.
  void Notify(const std::vector<OutboxRow>& rows, const OutboxSettlement& settled, int64_t republished) const;
  struct State;
  OutboxStore& store_;
  Publisher& publisher_;
  Options options_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<State> state_;
};

// Makes SIGINT and SIGTERM call relay->Stop(): Run returns after the round
// in flight, what it published recorded (idem/signals.h: other objects
// attached stop too; the handlers before the first attach come back when the
// last one is detached). Pass nullptr to detach every object; the relay's
// destructor detaches it.
void StopOnSignals(OutboxRelay* relay);

}  // namespace idem

#endif  // IDEM_OUTBOX_RELAY_H_
