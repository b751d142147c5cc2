// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The PostgreSQL store: markers and business data in one PostgreSQL
// database, one local transaction for both (READ COMMITTED). The unique key on
// (consumer, id) settles races between processes on many machines: a second
// insert of the same id waits for the first transaction and then sees a
// duplicate (it committed) or inserts (it rolled back).
//
// Thread safety: the Store is safe from many threads; each transaction gets
// its own connection from a small pool.
#ifndef IDEM_POSTGRES_STORE_H_
#define IDEM_POSTGRES_STORE_H_

#include <memory>
#include <string>

#include "idem/env.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem::postgres {

struct Options {
  // Where to connect: "postgres://user:password@host:port/db?sslmode=disable",
  // libpq "key=value" pairs, or "" to use libpq's environment variables
  // (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, ...). A URL may also
  // carry idem's own "idem_partition_by_day=true" and "idem_pool_size=N"
  // (taken out before libpq sees the URL). Default: "".
  std::string url;
  // Idle connections kept for reuse. More are opened under load and closed
  // when returned: size it to the threads that use the store at once, or
  // every call past it pays a new connection. Default: 8.
  int pool_size = 8;
  // Seconds to wait for a connection before Code::kUnavailable. Default: 5.
  int connect_timeout_s = 5;
  // Keep markers in a table range-partitioned by processing day (UTC), so
  // that Purge drops whole days (DROP TABLE: no row deletes, no bloat, no
  // vacuum) instead of deleting rows. Uniqueness of (consumer, id) across the
  // days is kept by a transaction-scoped advisory lock per key, taken before
  // the existence check, so racing consumers are still serialised per key.
  // Partitions are created for today and partition_days_ahead more days at
  // open and at every purge; rows for other days land in a default
  // partition that purge cleans row by row. Both layouts live side by side in
  // one database; a consumer must use one of them consistently.
  // Default: false (one table, purged row by row in batches).
  bool partition_by_day = false;
  int partition_days_ahead = 2;
  // Create idem's tables when missing. Default: true. When false, a database
  // without idem's schema is Code::kSchemaMismatch.
  bool create_if_missing = true;
  // Default: Env::Default().
  Env* env = nullptr;
  // The clock claims (two-phase mode) are judged by. Default (nullptr): the
  // server's, so that every client agrees whatever its own clock says. Tests
  // pass a FakeEnv.
  Env* claim_clock = nullptr;
};

// Connects, then creates or migrates idem's tables (serialised between
// processes by an advisory lock). Errors: kUnavailable (unreachable server,
// wrong password, no such database), kSchemaMismatch (newer schema, or none
// with create_if_missing off).
Result<std::unique_ptr<Store>> Open(const Options& options);

// `url` with its password replaced by "***", for messages and output.
std::string RedactUrl(std::string_view url);

// Whether `url` names a PostgreSQL store ("postgres://" or "postgresql://").
bool IsUrl(std::string_view url);

}  // namespace idem::postgres

#endif  // IDEM_POSTGRES_STORE_H_
