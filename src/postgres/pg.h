// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: RAII wrappers over libpq. Never included from a public header.
#ifndef IDEM_SRC_POSTGRES_PG_H_
#define IDEM_SRC_POSTGRES_PG_H_

#include <libpq-fe.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "idem/result.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem::pg_internal {

// The one place where SQLSTATE codes become idem codes.
Code CodeForSqlState(std::string_view sqlstate);
// A failed result (or none: the connection died) as a Status. `what` says
// what was being done.
Status Translate(const PGresult* res, PGconn* conn, std::string_view what);

struct ResultDeleter {
  void operator()(PGresult* r) const noexcept { PQclear(r); }
};
using ResultPtr = std::unique_ptr<PGresult, ResultDeleter>;

struct Encoded;  // a statement's parameters in libpq's form (pg.cc)

// One connection with a cache of prepared statements. One thread at a time.
class Conn {
 public:
  // `conninfo`: a postgres:// URL, key=value pairs, or "" (libpq's PG*
  // environment variables). Errors: kUnavailable naming the server and
  // libpq's reason (refused, timeout, wrong password, no such database).
  static Result<std::unique_ptr<Conn>> Connect(const std::string& conninfo, int64_t connect_timeout_ms);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  PGconn* raw() const { return conn_; }
  bool healthy() const { return PQstatus(conn_) == CONNECTION_OK; }
  // Behind a transaction pooler (pgbouncer pool_mode=transaction) each
  // transaction may run on another server session: statements are then
  // sent unnamed (parsed at each execution), never prepared, so that no
  // name lives on in a session another client gets. Pipelining stays.
  void set_pooled(bool pooled) { pooled_ = pooled; }
  bool pooled() const { return pooled_; }
  // Whether a pooler stands between this connection and the server: the
  // backend key libpq got at startup is not the server process's id (a
  // multiplexing pooler makes its own). One query.
  Result<bool> BehindAPooler();
  bool in_transaction() const;

  // Runs SQL without parameters (may hold several statements).
  Status Script(std::string_view sql);
  // A statement with $1..$n parameters, prepared once per connection. The
  // result is kept; read it with ToRows / AffectedRows.
  Result<ResultPtr> Exec(std::string_view sql, std::span<const Value> params);
  // Statements (they may differ) in one round trip after `first` (when not
  // empty), in libpq's pipeline mode: their results in order, or the first
  // failure (inside a transaction a failing one aborts it). Reconnects and
  // tries again once only when `first` begins the transaction.
  struct Statement {
    std::string_view sql;
    std::span<const Value> params;
  };
  Result<std::vector<ResultPtr>> ExecFlight(std::string_view first, std::span<const Statement> statements);

 private:
  explicit Conn(PGconn* c) : conn_(c) {}
  // The prepared statement for (sql, parameter kinds): its name, and whether
  // it must be prepared first.
  struct Prepared {
    std::string key, name;
    bool prepare = false;
  };
  Prepared StatementFor(std::string_view sql, const Encoded& e) const;
  // One execution in a flight.
  struct Step {
    std::string_view sql;
    const Encoded* params;
  };
  // [`first`,] each step (a PREPARE in front where needed), a sync: one
  // round trip in libpq's pipeline mode.
  Result<std::vector<ResultPtr>> Flight(std::string_view first, std::span<const Step> steps);
  // Flight, and once more on a reset connection when the flight that
  // begins the transaction (`first` not empty) found the connection dead.
  Result<std::vector<ResultPtr>> FlightOrAgain(std::string_view first, std::span<const Step> steps);
  PGconn* conn_;
  bool pooled_ = false;
  std::unordered_map<std::string, std::string> prepared_;  // sql -> statement name
};

// Decodes every row of a text-format result into Values (bytea -> Blob,
// integers -> int, floats -> double, bool -> 0/1, the rest -> text).
Rows ToRows(const PGresult* res);
// The row count of an INSERT/UPDATE/DELETE result.
int64_t AffectedRows(const PGresult* res);

}  // namespace idem::pg_internal

#endif  // IDEM_SRC_POSTGRES_PG_H_
