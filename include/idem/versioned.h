// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// ApplyIfNewer: versioned writes for naturally idempotent, ordered updates
// ("set the balance to X as of version V"). Inside the transaction that makes
// the update, it records the newest version applied per (entity, key) and
// says whether this one is newer; apply the update only then. A redelivery
// (same version) and a late, out-of-order message (older version) change
// nothing, with no per-message marker at all.
//
//   auto newer = idem::ApplyIfNewer(tx, "account", account_id, event.version);
//   if (!newer.ok()) return newer.status();
//   if (*newer) IDEM_RETURN_IF_ERROR(tx.Exec("UPDATE accounts SET balance = $1 WHERE id = $2", {...}).status());
//
// Works on every SQL store (the table idem_versions comes with the schema).
// Only for updates whose latest version carries the whole state: an
// increment ("add $40") is not idempotent this way; use the Inbox.
#ifndef IDEM_VERSIONED_H_
#define IDEM_VERSIONED_H_

#include <cstdint>
#include <string_view>

#include "idem/result.h"
#include "idem/store.h"

namespace idem {

// True when `version` is newer than the one recorded for (entity, key) (or
// none is), and records it; false otherwise (nothing recorded). Both in `tx`.
Result<bool> ApplyIfNewer(Transaction& tx, std::string_view entity, std::string_view key, int64_t version);

}  // namespace idem

#endif  // IDEM_VERSIONED_H_
