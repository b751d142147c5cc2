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

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/env.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem::postgres {

// Opens PostgreSQL stores. What Open returns is an idem::Store
// (idem/store.h), the type users hold.
class Store {
 public:
  struct Options {
    // Where to connect: "postgres://user:password@host:port/db?sslmode=disable",
    // libpq "key=value" pairs, or "" to use libpq's environment variables
    // (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, ...). A URL may also
    // carry idem's own keys (see ParseUrl), which Open takes out before libpq
    // sees the URL. Default: "".
    std::string url{};
    // Idle connections kept for reuse. More are opened under load and closed
    // when returned: size it to the threads that use the store at once, or
    // every call past it pays a new connection. (Claims and completions
    // outside a transaction past it share flights instead: one round trip
    // and one commit for each flight.) >= 1. Default: 8.
    // URL: ?idem_pool_size=N.
    int pool_size = 8;
    // Milliseconds to wait for a connection before Code::kUnavailable, > 0.
    // libpq counts whole seconds: rounded up to the next second. A URL's own
    // connect_timeout (libpq's key, in seconds) wins. Default: 5000.
    // URL: ?idem_connect_timeout_ms=N.
    int64_t connect_timeout_ms = 5'000;
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
    // URL: ?idem_partition_by_day=true|false.
    bool partition_by_day = false;
    // Days after today whose partitions are made ahead of time, 0..366.
    // Default: 2.
    int partition_days_ahead = 2;
    // Create idem's tables when missing. Default: true. When false, a database
    // without idem's schema is Code::kSchemaMismatch.
    // URL: ?idem_create_if_missing=true|false.
    bool create_if_missing = true;
    // The clock of the store's records and waits. Default (nullptr):
    // Env::Default().
    Env* env = nullptr;
    // The clock claims (two-phase mode) are judged by. Default (nullptr): the
    // server's, so that every client agrees whatever its own clock says. Tests
    // pass a FakeEnv.
    Env* claim_clock = nullptr;
    // Whether a connection pooler in transaction mode (pgbouncer
    // pool_mode=transaction, or a managed pooler like it) stands between the
    // store and the server. Behind one, each transaction may run on another
    // server session, so nothing may outlive a transaction there: statements
    // go unnamed (never prepared), and claims' bounded waits and the outbox
    // relay's wait poll instead of LISTENing. kAuto finds out on the
    // first connection (the backend key libpq got is not the server
    // process's id: any multiplexing pooler); kTransaction says so without
    // asking; kNone says there is none (a session pooler counts as none),
    // and a statement that then finds the session changed under it fails
    // naming ?idem_pooler=transaction, never running another's SQL.
    // Default: kAuto. URL: ?idem_pooler=auto|transaction|none.
    enum class Pooler { kAuto, kTransaction, kNone };
    Pooler pooler = Pooler::kAuto;
    // When a committed transaction counts as committed, so that the Inbox
    // (and everything that commits through this store) acknowledges. kCommit:
    // when the primary answers COMMIT (with synchronous replication the
    // server waited for its standby, unless that wait was cancelled: then
    // the commit is kInDoubt). kStandbyFlush: only once a standby has
    // flushed the WAL up to the commit (pg_stat_replication.flush_lsn; the
    // role needs pg_monitor), waited for up to standby_wait_ms; then the
    // commit is kInDoubt, and so is a marker found before a standby has it,
    // so the message is not acknowledged yet but redelivered. This keeps
    // an acknowledged effect through a failover that asynchronous
    // replication, or a synchronous setting dropped for a while, would lose.
    // Default: kCommit. URL: ?idem_ack_after=commit|standby_flush.
    enum class AckAfter { kCommit, kStandbyFlush };
    AckAfter ack_after = AckAfter::kCommit;
    // With kStandbyFlush: how long a commit waits for a standby, 1..600000.
    // Default: 10000. URL: ?idem_standby_wait_ms=N.
    int64_t standby_wait_ms = 10'000;
  };

  // Checks the options, connects, then creates or migrates idem's tables
  // (serialised between processes by an advisory lock). idem's own keys
  // left in `options.url` are applied as ParseUrl would. Errors:
  // kInvalidArgument (a bad option, naming it), kUnavailable (unreachable
  // server, wrong password, no such database: the message shows the URL
  // with its password hidden), kSchemaMismatch (newer schema, or none with
  // create_if_missing off).
  static Result<std::unique_ptr<idem::Store>> Open(const Options& options);

  // Reads "postgres://..." or "postgresql://..." into options: `url` keeps
  // everything libpq reads (its own query keys included), and idem's keys
  // are taken out into the fields: idem_pool_size, idem_connect_timeout_ms,
  // idem_partition_by_day, idem_create_if_missing, idem_pooler, idem_ack_after,
  // idem_standby_wait_ms. Another idem_ key, or one
  // given twice: kInvalidArgument naming it. Any other scheme:
  // kInvalidArgument.
  static Result<Options> ParseUrl(std::string_view url);

  Store() = delete;
};

}  // namespace idem::postgres

#endif  // IDEM_POSTGRES_STORE_H_
