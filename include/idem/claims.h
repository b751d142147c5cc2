// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Claims: the two-phase mode, for work that takes long or calls something no
// local transaction covers (a payment provider, an HTTP API). A key is first
// claimed as in progress with a lease and that claim is committed; the work
// runs; then the key is completed with its stored result. Later calls with the
// key get the stored result (a replay) instead of running the work again.
//
//   auto claims = idem::Claims::Open(*claim_store, {.retention_ms = 24 * 3600 * 1000});
//   if (!claims.ok()) return claims.status();
//   auto c = (*claims)->Claim({.scope = "charges", .key = key, .fingerprint = fp,
//                          .lease_ms = 30'000, .wait_ms = 2'000});
//   if (!c.ok()) return c.status();
//   switch (c->kind) {
//     case idem::ClaimOutcome::Kind::kStarted: {
//       std::string receipt = Charge(...);            // the work, once
//       return (*claims)->Complete(c->token, receipt);   // fenced by c->token
//     }
//     case idem::ClaimOutcome::Kind::kCompleted: return Reply(c->result);  // replay
//     case idem::ClaimOutcome::Kind::kInProgress: return RetryAfter(c->retry_at_ms);
//     case idem::ClaimOutcome::Kind::kConflict: return Reject();  // key reused
//   }
//
// Fencing: every claim that starts the work gets a fencing token from a
// counter that only grows, store-wide (on Redis, per key: each new holder's
// token is above every earlier holder's, also after a restart that lost the
// counter, given a sane server clock; see redis/claim_store.h). A store that
// forgets its claims (Redis without persistence) can still let the work run
// again: the downstream's idempotency key covers that. When a holder's lease
// expires, the next claimer takes the key over with a higher token, and from
// then on the old holder's Complete, Fail and Extend are refused with
// Code::kLeaseLost. A holder whose lease expired but was not taken over may
// still complete.
//
// Time: leases and expiry are judged by the store's clock (the server's on
// PostgreSQL and Redis; the machine's on SQLite, which is local), never by a
// client's own, so clients with skewed clocks agree on who holds a key.
//
// The values (ClaimRequest, ClaimOutcome, ...) are in idem/claim_types.h;
// the storage contract a store implements is idem/claim_store.h.
//
// Thread safety: Claims may be used from many threads.
#ifndef IDEM_CLAIMS_H_
#define IDEM_CLAIMS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/claim_store.h"
#include "idem/claim_types.h"
#include "idem/env.h"
#include "idem/message.h"
#include "idem/observer.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem {

// The front end: validation, bounded waits, Fail policies.
class Claims {
 public:
  struct Options {
    // How long a completed record is kept (and replayed), > 0: a result kept
    // for no time would let the work run again at once. Default: 24 hours.
    int64_t retention_ms = 24LL * 3600 * 1000;
    // A bounded wait re-reads the key at least this often (for changes its
    // watch cannot hear: another process's, on SQLite; a lease running
    // out), > 0. Default: 50 ms.
    int64_t poll_ms = 50;
    // The clock a bounded wait is measured on. Default (nullptr):
    // Env::Default().
    Env* env = nullptr;
    // Optional: told each claim's outcome and each holder's completion,
    // release and fencing (kClaim* in idem/observer.h). Must outlive the
    // Claims.
    Observer* observer = nullptr;
  };

  // Checks the options (kInvalidArgument naming the field), then makes the
  // front end. `store` must outlive the Claims.
  static Result<std::unique_ptr<Claims>> Open(ClaimStore& store, const Options& options);
  static Result<std::unique_ptr<Claims>> Open(ClaimStore& store);
  // With the default options (valid by construction). `store` must outlive
  // the Claims.
  explicit Claims(ClaimStore& store);
  Claims(const Claims&) = delete;
  Claims& operator=(const Claims&) = delete;

  // Claims request.key in request.scope (see ClaimOutcome::Kind). With wait_ms > 0 a
  // key in progress is waited for (woken by its completion, re-checked at
  // least every poll_ms) up to wait_ms, then answered kInProgress.
  Result<ClaimOutcome> Claim(const ClaimRequest& request);
  // Stores `result` as the key's result: later claims replay it.
  Status Complete(const ClaimToken& token, std::string_view result);

  // Claim and Complete for many keys at once (a consumer's batch, or many
  // calls in flight on one thread): one answer per request, in order, as
  // Claim and Complete would give them one by one. On Redis the claims
  // travel in one pipeline, and so do the completions. A request with
  // wait_ms > 0 whose key is in progress is then waited for as Claim does.
  //
  //   std::vector<idem::ClaimRequest> reqs = ...;          // one per message
  //   auto outcomes = claims.ClaimMany(reqs);
  //   std::vector<idem::Completion> done;
  //   for (size_t i = 0; i < reqs.size(); ++i)
  //     if (outcomes[i].ok() && outcomes[i]->kind == idem::ClaimOutcome::Kind::kStarted)
  //       done.push_back({.token = &outcomes[i]->token, .result = results.emplace_back(Work(reqs[i]))});
  //   auto statuses = claims.CompleteMany(done);        // results: a std::deque<std::string>
  std::vector<Result<ClaimOutcome>> ClaimMany(std::span<const ClaimRequest> requests);
  std::vector<Status> CompleteMany(std::span<const Completion> completions);
  // The work failed with `error`: release the key, or store the error as the
  // result (replayed, with result_is_error).
  Status Fail(const ClaimToken& token, FailPolicy policy, std::string_view error);
  // Heartbeat: extends the lease by lease_ms from now (store clock). Updates
  // token.lease_until_ms.
  Status Extend(ClaimToken& token, int64_t lease_ms);

  ClaimStore& store() { return store_; }
  const Options& options() const { return options_; }

 private:
  // Tells the observer (if any) the outcome of a claim, or of a holder's write.
  void Tell(const ClaimRequest& request, const Result<ClaimOutcome>& outcome) const;
  Status Told(const ClaimToken& token, Status written, EventKind ok_kind) const;
  Claims(ClaimStore& store, const Options& options);

  ClaimStore& store_;
  Options options_;
};

// ---------------------------------------------------------------------------
// Two-phase steps inside a consumer's handler.
//
// CallOnce runs `call` -- a request to a service no local transaction covers
// -- at most once per (message, step) across every delivery of the message,
// and returns its result: by running it (claim, call, complete), or from the
// result an earlier delivery stored. The call is given
// DownstreamKey(message, step) to send as its idempotency key, so a receiver
// that honours keys also absorbs the one repeat that a crash between the call
// and its Complete can cause (after the lease, the next delivery takes over
// and calls again with the same key).
//
//   inbox.Handle(msg, [&](idem::Transaction& tx, const idem::Message& m) -> idem::Status {
//     auto charge = idem::CallOnce(claims, m, "charge", [&](const std::string& key) {
//       return provider.Charge(key, m.payload);          // Result<std::string>
//     });
//     if (!charge.ok()) return charge.status();          // kInProgress: redelivered later
//     return tx.Exec("INSERT INTO payments(order_id, charge) VALUES ($1, $2)", {m.id, *charge}).status();
//   });
//
// Errors: kInProgress while another delivery holds the step (the Consumer
// redelivers it after a backoff and counts no failure); kConflict when the
// step's key was used for another payload; the call's own error otherwise
// (the claim is released, or stored with FailPolicy::kStoreError); a stored
// failure is replayed as kHandlerFailed.
// On SQLite keep the claims in a file of their own: the handler's transaction
// holds the inbox file's write lock while CallOnce commits its claim. Claims
// in the inbox's own file are kInvalidArgument naming the fix, the set-up's
// mistake and not the message's: the Inbox commits and counts nothing for
// that batch, and a Consumer stops (Run() returns it), dead-lettering nothing.
// ---------------------------------------------------------------------------
struct CallOnceOptions {
  int64_t lease_ms = 30'000;  // how long the call may take before a takeover
  int64_t wait_ms = 0;        // wait this long for another holder's result
  FailPolicy on_error = FailPolicy::kRelease;
};

Result<std::string> CallOnce(Claims& claims, const Message& message, std::string_view step,
                             const std::function<Result<std::string>(const std::string& downstream_key)>& call,
                             const CallOnceOptions& options = {});

}  // namespace idem

#endif  // IDEM_CLAIMS_H_
