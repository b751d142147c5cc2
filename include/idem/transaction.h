// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Transaction: what a handler sees. The Inbox hands the handler one open
// transaction on its store; the handler writes its business rows through it,
// and they commit together with the message's marker, or not at all.
//
//   inbox->Handle(msg, [](idem::Transaction& tx, const idem::Message& m) -> idem::Status {
//     return tx.Exec("INSERT INTO payments(order_id) VALUES ($1)", {m.id}).status();
//   });
//
// Thread safety: a Transaction belongs to one thread at a time.
#ifndef IDEM_TRANSACTION_H_
#define IDEM_TRANSACTION_H_

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "idem/result.h"
#include "idem/status.h"

namespace idem {

class StoreTransaction;
namespace internal {
struct TransactionGate;
}  // namespace internal

// A SQL parameter or column value.
struct Blob {
  std::string bytes{};
};
class Value {
 public:
  Value() = default;        // SQL NULL
  Value(std::nullptr_t) {}  // NOLINT
  template <std::integral T>
  Value(T v) : v_(static_cast<int64_t>(v)) {}        // NOLINT: any integer, bool as 0/1
  Value(double v) : v_(v) {}                         // NOLINT
  Value(std::string v) : v_(std::move(v)) {}         // NOLINT
  Value(std::string_view v) : v_(std::string(v)) {}  // NOLINT
  Value(const char* v) : v_(std::string(v)) {}       // NOLINT
  Value(Blob v) : v_(std::move(v)) {}                // NOLINT

  bool is_null() const { return std::holds_alternative<std::monostate>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_double() const { return std::holds_alternative<double>(v_); }
  bool is_text() const { return std::holds_alternative<std::string>(v_); }
  bool is_blob() const { return std::holds_alternative<Blob>(v_); }
  // Conversions: an integer as a double, a number's text, a blob's bytes as
  // text; 0 for NULL and non-numeric text. AsInt truncates a double and
  // holds it within int64_t (NaN: 0), as it does a number's text.
  int64_t AsInt() const;
  double AsDouble() const;
  std::string AsText() const;

  const std::variant<std::monostate, int64_t, double, std::string, Blob>& raw() const { return v_; }

 private:
  std::variant<std::monostate, int64_t, double, std::string, Blob> v_;
};

struct Rows {
  std::vector<std::string> columns{};
  std::vector<std::vector<Value>> rows{};
};

// An open transaction. Parameters are written $1, $2, ... in the SQL text on
// every store, so a handler's SQL runs unchanged on SQLite and PostgreSQL.
class Transaction {
 public:
  virtual ~Transaction() = default;
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  // Runs a statement; returns the number of rows it changed.
  virtual Result<int64_t> Exec(std::string_view sql, std::span<const Value> params) = 0;
  // Runs a query; returns all of its rows.
  virtual Result<Rows> Query(std::string_view sql, std::span<const Value> params) = 0;
  // The store's own handle (sqlite3* on SQLite), for what Exec/Query cannot
  // do. Do not commit, roll back or close through it.
  virtual void* NativeHandle() = 0;
  // Queues one row for `insert`: an INSERT with one VALUES tuple of
  // parameters ("INSERT INTO t(a, b) VALUES ($1, $2)", optionally followed
  // by ON CONFLICT ...; no RETURNING: nobody reads its answer). The rows
  // queued for one statement text go to the database together, as one
  // multi-row INSERT, before the transaction's next statement or at its
  // commit: where each statement is a round trip (PostgreSQL), the requests
  // or messages of a group that each queue a row pay one round trip for all
  // of them, and that round trip is the next statement's own (pipelined).
  // The insert's error is the error of the statement or commit it went with. Every row of one text must have the same
  // number of values. The default runs it at once.
  virtual Status InsertLater(std::string_view insert, std::span<const Value> row) { return Exec(insert, row).status(); }

  Result<int64_t> Exec(std::string_view sql, std::initializer_list<Value> params = {}) {
    return Exec(sql, std::span<const Value>(params.begin(), params.size()));
  }
  Result<Rows> Query(std::string_view sql, std::initializer_list<Value> params = {}) {
    return Query(sql, std::span<const Value>(params.begin(), params.size()));
  }
  Status InsertLater(std::string_view insert, std::initializer_list<Value> row) {
    return InsertLater(insert, std::span<const Value>(row.begin(), row.size()));
  }

 protected:
  Transaction() = default;

 private:
  friend struct internal::TransactionGate;
  // The store transaction this is (StoreTransaction overrides it), for the
  // library only (Outbox::Add). Null for any other Transaction.
  virtual StoreTransaction* store_transaction() { return nullptr; }
};

}  // namespace idem

#endif  // IDEM_TRANSACTION_H_
