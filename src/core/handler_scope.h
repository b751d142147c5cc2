// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: what a running handler's thread knows of the transaction it runs
// in, for the checks that need it (CallOnce refuses claims that would wait on
// the write lock this very transaction holds).
#ifndef IDEM_SRC_CORE_HANDLER_SCOPE_H_
#define IDEM_SRC_CORE_HANDLER_SCOPE_H_

#include <string>

#include "idem/status.h"

namespace idem::internal {

// While alive, the calling thread runs a handler inside a transaction whose
// store holds the write lock `write_lock_id` (Store::WriteLockId; may be
// empty). Scopes nest.
class HandlerScope {
 public:
  explicit HandlerScope(const std::string& write_lock_id);
  ~HandlerScope();
  HandlerScope(const HandlerScope&) = delete;
  HandlerScope& operator=(const HandlerScope&) = delete;

 private:
  const std::string* previous_;
};

// The write lock held by the transaction of the handler running on this
// thread; nullptr outside a handler (or when the store has none).
const std::string* HeldWriteLock() noexcept;

// A set-up that can never work, found by code a handler called (CallOnce
// with its claims under the write lock the handler's transaction holds): not
// the message's failure. Recorded for this thread until the Inbox handles
// its next batch; the Inbox then commits nothing and counts nothing, and a
// Consumer stops with it (Run() returns it) instead of counting a failure.
void RefuseSetup(const Status& why);
void ClearSetupRefusal() noexcept;
// The refusal recorded on this thread since the Inbox's current (or last)
// batch began; nullptr when none.
const Status* SetupRefusal() noexcept;

}  // namespace idem::internal

#endif  // IDEM_SRC_CORE_HANDLER_SCOPE_H_
