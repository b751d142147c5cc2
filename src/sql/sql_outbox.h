// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the outbox on every SQL store (idem/outbox_store.h): rows
// written in the user's transaction, relay sessions that hold lanes, fetch,
// and settle in one transaction per round.
#ifndef IDEM_SRC_SQL_SQL_OUTBOX_H_
#define IDEM_SRC_SQL_SQL_OUTBOX_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "idem/outbox_store.h"
#include "sql/sql_store.h"

namespace idem::sql_internal {

// FNV-1a over the ordering key (the id when the key is empty): the lane is
// this mod the dialect's lane count, the per-key lock its low 32 bits.
// Specified and fixed: rows already stored keep their lane.
uint64_t OutboxKeyHash(std::string_view key_or_id);

class SqlOutbox final : public OutboxStore {
 public:
  explicit SqlOutbox(SqlStore& store) : store_(store) {}
  Result<std::unique_ptr<OutboxSession>> OpenSession(std::string_view name) override;
  Result<OutboxStats> Stats() override;
  Result<bool> HasUnsent() override;
  Result<std::vector<OutboxDeadLetter>> ListDeadLetters(int limit) override;
  Result<int64_t> PurgeOutbox(int64_t sent_before_ms, int64_t dead_before_ms, int batch_size) override;

 private:
  SqlStore& store_;
};

}  // namespace idem::sql_internal

#endif  // IDEM_SRC_SQL_SQL_OUTBOX_H_
