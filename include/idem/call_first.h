// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// CallFirst: a handler in two parts, for messages whose work includes calls
// no local transaction covers (a payment provider, another service). The
// seed's advice for remote calls: "make the call first and open the
// transaction afterwards: a redelivery then repeats the call, which the key
// makes harmless".
//
//  1. `calls` runs first, with no transaction open and no store connection
//     held. Each call goes through Calls::Once: a claim (idem/claims.h) with
//     a lease, the call with DownstreamKey(message, step) as its idempotency
//     key, and its result stored. A redelivery replays the stored result
//     instead of calling again.
//  2. Then the Inbox's transaction opens: the marker is inserted and `apply`
//     writes the effect with the calls' results. The marker and the effect
//     commit together, as with a plain Handler.
//
//   idem::Claims claims(*claim_store);   // any ClaimStore; on SQLite the inbox's own file is fine here
//   idem::CallFirst charge(claims,
//       [&](idem::Calls& calls, const idem::Message& m) -> idem::Status {
//         return calls.Once("charge", [&](const std::string& key) { return provider.Charge(key, m.payload); })
//             .status();
//       },
//       [](idem::Transaction& tx, const idem::Message& m, const idem::Calls& calls) -> idem::Status {
//         return tx.Exec("INSERT INTO payments(order_id, charge) VALUES ($1, $2)", {m.id, calls.at("charge")})
//             .status();
//       });
//   auto consumer = idem::Consumer::Open(source, inbox, charge, {.workers = 4});   // or inbox.Handle(message, charge)
//
// When to use which form:
//  - CallFirst when a call takes long or may hang (the usual case for a
//    remote API): no connection is held and, on SQLite, no write lock, so
//    workers overlap their calls and a hung call stalls only its own worker.
//  - CallOnce inside a plain Handler when the call must see the
//    transaction's reads (it runs after the marker, under the transaction's
//    locks) and is short. On SQLite its claims must live in another file.
//
// A message whose marker exists (handled before) makes no call: the marker
// is read first. Two deliveries racing on one message make each call once
// (the claim settles it) and apply once (the marker settles it).
//
// Thread safety: a CallFirst is immutable; its functions are called from the
// Consumer's workers at once, so they must be safe to run concurrently.
#ifndef IDEM_CALL_FIRST_H_
#define IDEM_CALL_FIRST_H_

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "idem/claims.h"
#include "idem/message.h"
#include "idem/result.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem {

// The calls of one message's `calls` part and their results, by step.
class Calls {
 public:
  Calls(Claims& claims, const Message& message) : claims_(claims), message_(message) {}
  Calls(const Calls&) = delete;
  Calls& operator=(const Calls&) = delete;

  // CallOnce(claims, message, step, call, options): runs `call` at most once
  // per (message, step) across every delivery and returns its result, which
  // is also kept for the transactional part. Errors as CallOnce's: return
  // them from `calls` (kInProgress is redelivered without a failure counted).
  Result<std::string> Once(std::string_view step,
                           const std::function<Result<std::string>(const std::string& downstream_key)>& call,
                           const CallOnceOptions& options = {});

  // The result of `step`'s successful Once; nullptr if there is none.
  const std::string* Find(std::string_view step) const;
  // The same; throws std::out_of_range naming the step if there is none (in
  // `apply`, a programming error: the handler fails, nothing commits).
  const std::string& at(std::string_view step) const;

  const Message& message() const { return message_; }

 private:
  Claims& claims_;
  const Message& message_;
  std::map<std::string, std::string, std::less<>> results_;
};

class CallFirst {
 public:
  using CallsFn = std::function<Status(Calls& calls, const Message& message)>;
  using ApplyFn = std::function<Status(Transaction& tx, const Message& message, const Calls& calls)>;

  // `claims` must outlive the CallFirst. Both functions are required (the
  // Inbox refuses an empty one, as it refuses an empty Handler). Errors from
  // either mean what a Handler's errors mean (Status::Rejected: never
  // retried; kInProgress: redelivered, not counted; others: counted).
  CallFirst(Claims& claims, CallsFn calls, ApplyFn apply)
      : claims_(&claims), calls_(std::move(calls)), apply_(std::move(apply)) {}

  Claims& claims() const { return *claims_; }
  const CallsFn& calls() const { return calls_; }
  const ApplyFn& apply() const { return apply_; }
  bool complete() const { return calls_ && apply_; }

 private:
  Claims* claims_;
  CallsFn calls_;
  ApplyFn apply_;
};

}  // namespace idem

#endif  // IDEM_CALL_FIRST_H_
