// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Store: the database that holds both the markers and the business data, so
// that one local transaction can commit them together. Users open one
// (idem::OpenStore, or an adapter's Store::Open: idem/sqlite/store.h,
// idem/postgres/store.h), hold it as a std::unique_ptr<Store> and pass it
// to an Inbox; their handlers see only idem::Transaction (idem/transaction.h).
//
// This header holds the calls a user makes. What a store implements besides
// (StoreTransaction's marker operations, the records, and the hooks only the
// library calls) is in idem/store_backend.h.
//
// Thread safety: a Store is safe to use from many threads (each Begin() gets
// its own connection). A StoreTransaction belongs to one thread at a time.
#ifndef IDEM_STORE_H_
#define IDEM_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/result.h"
#include "idem/store_backend.h"

namespace idem {

class ClaimStore;
class OutboxStore;

class Store : public StoreHooks {
 public:
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Begins a write transaction (on SQLite: BEGIN IMMEDIATE, so two processes
  // on one file are serialised rather than failing at commit). The
  // transaction holds one of the store's connections: end it (or destroy
  // it) before the Store is destroyed. Inside it, BEGIN, COMMIT and ROLLBACK
  // through Exec/Query are refused (use Commit/Rollback; savepoints are fine).
  // The transaction is an idem::Transaction with Commit() and Rollback()
  // (StoreTransaction, idem/store_backend.h); its destructor rolls back
  // unless Commit() succeeded.
  Result<std::unique_ptr<StoreTransaction>> Begin() override = 0;

  // Reads a marker outside any transaction (on a fresh connection). Give the
  // producer time when the marker may have been keyed by it.
  virtual Result<std::optional<Marker>> FindMarker(std::string_view consumer, std::string_view id,
                                                   std::optional<int64_t> produced_at_ms = std::nullopt) = 0;

  // Deletes markers processed before `before_ms`, at most `batch_size` per
  // transaction, until none is left. Returns how many were deleted. An empty
  // consumer means all consumers.
  virtual Result<int64_t> Purge(std::string_view consumer, int64_t before_ms, int batch_size) = 0;

  // Inspection. An empty consumer means every consumer; lists hold at most
  // `limit` (>= 0; negative is kInvalidArgument), newest first.
  virtual Result<int64_t> CountMarkers(std::string_view consumer) = 0;
  virtual Result<std::vector<Marker>> ListMarkers(std::string_view consumer, int limit) = 0;
  virtual Result<std::vector<DeadLetter>> ListDeadLetters(std::string_view consumer, int limit) = 0;
  // The schema version and the DDL of idem's own tables, for `idem schema`.
  struct SchemaInfo {
    int version = 0;
    std::vector<std::string> statements{};
  };
  virtual Result<SchemaInfo> Schema() = 0;

  // "sqlite", "postgres".
  virtual std::string_view Kind() const = 0;

  // The same database as a ClaimStore (two-phase mode, idem/claims.h), or
  // nullptr where the store has none. The SQLite and PostgreSQL stores have
  // one; it lives as long as the Store.
  virtual ClaimStore* claim_store() { return nullptr; }
  // The same database as an OutboxStore (idem/outbox.h), or nullptr. The
  // SQLite and PostgreSQL stores have one; it lives as long as the Store.
  virtual OutboxStore* outbox_store() { return nullptr; }

 protected:
  Store() = default;
};

}  // namespace idem

#endif  // IDEM_STORE_H_
