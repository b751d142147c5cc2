// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the calls between library classes that users must not make (as
// libpqxx's internal/callgate.hxx). Each gate is a friend of the one class it
// opens and exposes only the call the library needs; the header is never
// installed.
#ifndef IDEM_SRC_CORE_GATE_H_
#define IDEM_SRC_CORE_GATE_H_

#include "idem/inbox.h"
#include "idem/store_backend.h"
#include "idem/transaction.h"

namespace idem::internal {

// The Consumer's calls into the Inbox it runs.
struct InboxGate {
  // Counts a message the Consumer dead-lettered (InboxCounters::dead_lettered).
  static void NoteDeadLetter(Inbox& inbox);
};

// The library's view of a user's Transaction.
struct TransactionGate {
  // The store transaction `tx` is (the Inbox's, a Store::Begin's), or null
  // for any other Transaction: Outbox::Add writes through it.
  static StoreTransaction* StoreTransactionOf(Transaction& tx) { return tx.store_transaction(); }
};

}  // namespace idem::internal

#endif  // IDEM_SRC_CORE_GATE_H_
