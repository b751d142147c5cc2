// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: idem's tables on PostgreSQL and every statement that touches the
// markers. The marker's storage layout lives here and nowhere else.
#ifndef IDEM_SRC_POSTGRES_SCHEMA_H_
#define IDEM_SRC_POSTGRES_SCHEMA_H_

#include <cstdint>

#include "sql/sql_store.h"

namespace idem::pg_internal {

// Serialises migrations between processes opening the same database.
inline constexpr const char* kMigrationLock = "SELECT pg_advisory_xact_lock(7317283)";
// StoreTransaction::BoundLockWaits: lock_timeout for this transaction only
// (set_config's is_local, as SET LOCAL), a parameter so it can be prepared.
inline constexpr const char* kBoundLockWaits = "SELECT set_config('lock_timeout', $1, true)";

// Store::Options::ack_after = standby_flush: the WAL written so far (past a
// commit just made: with synchronous_commit on, its record was flushed before
// COMMIT answered; not the insert position, which at a page boundary points
// past the next page's header, where no standby gets until more WAL comes),
// and ($1 that position) how many standbys flushed up to it, and how many
// whose positions this role cannot see (NULL without pg_monitor).
inline constexpr const char* kWalWrittenLsn = "SELECT pg_current_wal_lsn()::text";
inline constexpr const char* kStandbysFlushed =
    "SELECT count(*) FILTER (WHERE flush_lsn >= $1::pg_lsn), count(*) FILTER (WHERE flush_lsn IS NULL AND"
    " state IS NULL) FROM pg_stat_replication";

inline constexpr const char* kCreateMigrations =
    "CREATE TABLE IF NOT EXISTS idem_migrations("
    " version integer PRIMARY KEY, description text NOT NULL, applied_at_ms bigint NOT NULL)";

inline constexpr sql_internal::Migration kMigrations[] = {
    {1, "markers, failure counts, dead letters",
     "CREATE TABLE idem_markers("
     " consumer text NOT NULL,"
     " id bytea NOT NULL,"
     " fingerprint bytea NOT NULL,"
     " processed_at_ms bigint NOT NULL,"
     " PRIMARY KEY (consumer, id));"
     "CREATE INDEX idem_markers_by_time ON idem_markers(processed_at_ms);"
     "CREATE TABLE idem_failures("
     " consumer text NOT NULL,"
     " id bytea NOT NULL,"
     " attempts integer NOT NULL,"
     " last_error text NOT NULL,"
     " updated_at_ms bigint NOT NULL,"
     " PRIMARY KEY (consumer, id));"
     "CREATE TABLE idem_dead_letters("
     " consumer text NOT NULL,"
     " id bytea NOT NULL,"
     " reason text NOT NULL,"
     " error text NOT NULL,"
     " attempts integer NOT NULL,"
     " payload bytea NOT NULL,"
     " at_ms bigint NOT NULL,"
     " PRIMARY KEY (consumer, id))"},
    {2, "markers partitioned by processing day (Options::partition_by_day)",
     // The primary key must hold the partition key; uniqueness of
     // (consumer, id) across days comes from the advisory lock per key.
     "CREATE TABLE idem_markers_daily("
     " consumer text NOT NULL,"
     " id bytea NOT NULL,"
     " fingerprint bytea NOT NULL,"
     " processed_at_ms bigint NOT NULL,"
     " PRIMARY KEY (consumer, id, processed_at_ms)) PARTITION BY RANGE (processed_at_ms);"
     "CREATE INDEX idem_markers_daily_by_time ON idem_markers_daily(processed_at_ms);"
     "CREATE TABLE idem_markers_daily_default PARTITION OF idem_markers_daily DEFAULT"},
    {3, "claims (two-phase mode) and their fencing sequence",
     // state: 0 in progress, 1 completed.
     "CREATE TABLE idem_claims("
     " scope text NOT NULL,"
     " key bytea NOT NULL,"
     " state smallint NOT NULL,"
     " fingerprint bytea NOT NULL,"
     " fence bigint NOT NULL,"
     " lease_until_ms bigint NOT NULL,"
     " expires_at_ms bigint NOT NULL,"
     " result bytea,"
     " result_is_error smallint NOT NULL,"
     " updated_at_ms bigint NOT NULL,"
     " PRIMARY KEY (scope, key));"
     "CREATE SEQUENCE idem_claim_fence"},
    {4, "claims: count of waiters, so that only a record someone waits for NOTIFYs",
     // A transaction that NOTIFYs takes a database-wide lock for its commit,
     // which serialised every completion's WAL flush (no group commit).
     "ALTER TABLE idem_claims ADD COLUMN waiters integer NOT NULL DEFAULT 0"},
    {5, "versions for ApplyIfNewer (naturally idempotent, ordered updates)",
     "CREATE TABLE idem_versions(entity text NOT NULL, key bytea NOT NULL, version bigint NOT NULL,"
     " PRIMARY KEY (entity, key))"},
    {6, "failures: since when a message has been in progress, and when it was parked",
     "ALTER TABLE idem_failures ADD COLUMN in_progress_since_ms bigint;"
     "ALTER TABLE idem_failures ADD COLUMN parked_at_ms bigint"},
    {7, "the transactional outbox: messages to publish, sent, dead; relays",
     // A queue table: rows come and go, so vacuum runs by row count.
     "CREATE SEQUENCE idem_outbox_seq;"
     "CREATE TABLE idem_outbox(seq bigint PRIMARY KEY, lane smallint NOT NULL, id bytea NOT NULL,"
     " destination text NOT NULL, ordering_key bytea NOT NULL, payload bytea NOT NULL, headers bytea NOT NULL,"
     " producer_time_ms bigint NOT NULL, added_at_ms bigint NOT NULL, attempts integer NOT NULL DEFAULT 0,"
     " last_error text) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);"
     "CREATE TABLE idem_outbox_sent(seq bigint PRIMARY KEY, id bytea NOT NULL, destination text NOT NULL,"
     " ordering_key bytea NOT NULL, payload bytea NOT NULL, headers bytea NOT NULL, producer_time_ms bigint NOT NULL,"
     " added_at_ms bigint NOT NULL, sent_at_ms bigint NOT NULL);"
     "CREATE TABLE idem_outbox_dead(seq bigint PRIMARY KEY, id bytea NOT NULL, destination text NOT NULL,"
     " ordering_key bytea NOT NULL, payload bytea NOT NULL, headers bytea NOT NULL, producer_time_ms bigint NOT NULL,"
     " added_at_ms bigint NOT NULL, attempts integer NOT NULL, reason text NOT NULL, error text NOT NULL,"
     " at_ms bigint NOT NULL);"
     "CREATE TABLE idem_outbox_relays(name text PRIMARY KEY, seen_at_ms bigint NOT NULL, lanes integer NOT NULL,"
     " asleep_until_ms bigint NOT NULL DEFAULT 0, backend_pid integer NOT NULL);"
     // Only a hint for the republished count: not worth a WAL record.
     "CREATE UNLOGGED TABLE idem_outbox_handed(lane integer PRIMARY KEY, upto bigint NOT NULL)"},
    {8, "the outbox's lanes as leases (a relay behind a transaction pooler has no session to lock in)",
     // Lost with a crash like the locks they replace: relays take them again.
     "CREATE UNLOGGED TABLE idem_outbox_lanes(lane integer PRIMARY KEY, holder text NOT NULL,"
     " until_ms bigint NOT NULL)"},
};

// A bounded wait's watch registers itself on the record (after LISTEN,
// before it reads the key), so the completion that follows sees it.
inline constexpr const char* kAddWaiter = "UPDATE idem_claims SET waiters = waiters + 1 WHERE scope = $1 AND key = $2";

// ---- claims. Judged by the server's clock: `now` is a parameter that is
// NULL unless the store was given a clock (tests), so every statement reads
// the time where the decision is made. Each write is one statement, in its
// own transaction or in a flight's shared one (PgStore::QueryAlone): the
// fence comes from the sequence inside it, and a completion or release wakes
// waiters (LISTEN idem_claims) when its transaction commits.
#define IDEM_PG_NOW(n) "COALESCE($" #n "::bigint, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)"
#define IDEM_PG_NOTIFY "CASE WHEN waiters > 0 THEN pg_notify('idem_claims', $1 || ':' || encode($2, 'hex')) END"
inline constexpr const char* kClaimsChannel = "idem_claims";
inline constexpr sql_internal::ClaimsSql kClaims{
    .select = "SELECT state, fingerprint, fence, lease_until_ms, expires_at_ms, result, result_is_error,"
              " updated_at_ms, " IDEM_PG_NOW(3) " FROM idem_claims WHERE scope = $1 AND key = $2",
    .insert = "INSERT INTO idem_claims VALUES ($1, $2, 0, $3, nextval('idem_claim_fence'), " IDEM_PG_NOW(5)
              " + $4, 0, NULL, 0, " IDEM_PG_NOW(5) ") ON CONFLICT DO NOTHING RETURNING fence, lease_until_ms",
    .take_over = "UPDATE idem_claims SET state = 0, fingerprint = $3, fence = nextval('idem_claim_fence'),"
                 " lease_until_ms = " IDEM_PG_NOW(5) " + $4, expires_at_ms = 0, result = NULL, result_is_error = 0,"
                 " updated_at_ms = " IDEM_PG_NOW(5) " WHERE scope = $1 AND key = $2 AND fence = $6 AND state = $7"
                 " AND CASE state WHEN 0 THEN lease_until_ms <= " IDEM_PG_NOW(5) " ELSE expires_at_ms <= "
                 IDEM_PG_NOW(5) " END RETURNING fence, lease_until_ms",
    .bump_fence = nullptr,
    .complete = "WITH u AS (UPDATE idem_claims SET state = 1, result = $4, result_is_error = $5,"
                " expires_at_ms = " IDEM_PG_NOW(7) " + $6, updated_at_ms = " IDEM_PG_NOW(7)
                " WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 0 RETURNING waiters)"
                " SELECT " IDEM_PG_NOTIFY " FROM u",
    .release = "WITH d AS (DELETE FROM idem_claims WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 0"
               " RETURNING waiters) SELECT " IDEM_PG_NOTIFY " FROM d",
    .extend = "UPDATE idem_claims SET lease_until_ms = " IDEM_PG_NOW(5) " + $4, updated_at_ms = " IDEM_PG_NOW(5)
              " WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 0 RETURNING lease_until_ms",
    .find = sql_internal::kFindClaim,
    .list = sql_internal::kListClaims,
    .purge = "DELETE FROM idem_claims WHERE (scope, key) IN (SELECT scope, key FROM idem_claims"
             " WHERE ($1 = '' OR scope = $1) AND ((state = 1 AND expires_at_ms <= " IDEM_PG_NOW(4) ")"
             " OR (state = 0 AND lease_until_ms + $2 <= " IDEM_PG_NOW(4) ")) LIMIT $3 FOR UPDATE SKIP LOCKED)",
    .now = "SELECT " IDEM_PG_NOW(1),
    .reserve_fences = nullptr,
    .insert_fenced = nullptr,
    // The insert, and when the key is there already its row as `select`
    // reads it, in one round trip (both parts see one snapshot: a row
    // committed by another claimer in between answers neither, and the
    // claimer looks again). A key seen there draws no fence and writes
    // nothing: a replay stays a read.
    .insert_or_read =
        "WITH ins AS (INSERT INTO idem_claims SELECT $1::text, $2::bytea, 0, $3::bytea, nextval('idem_claim_fence'), "
        IDEM_PG_NOW(5) " + $4::bigint, 0, NULL, 0, " IDEM_PG_NOW(5) " WHERE NOT EXISTS (SELECT 1 FROM idem_claims"
        " WHERE scope = $1 AND key = $2) ON CONFLICT DO NOTHING RETURNING fence, lease_until_ms)"
        " SELECT NULL::integer, NULL::bytea, fence, lease_until_ms, NULL::bigint, NULL::bytea, NULL::integer,"
        " NULL::bigint, NULL::bigint, 1 FROM ins UNION ALL SELECT state, fingerprint, fence, lease_until_ms,"
        " expires_at_ms, result, result_is_error, updated_at_ms, " IDEM_PG_NOW(5) ", 0 FROM idem_claims"
        " WHERE scope = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM ins)",
};
#undef IDEM_PG_NOW
#undef IDEM_PG_NOTIFY

// ---- the daily-partitioned layout
inline constexpr int64_t kDayMs = 86'400'000;
// One partition per UTC day: idem_markers_d<days since 1970-01-01>.
inline constexpr const char* kDailyPrefix = "idem_markers_d";
inline constexpr const char* kDailyPartitions =
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
    " JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'idem_markers_daily'"
    " AND p.relnamespace = current_schema()::regnamespace AND c.relname <> 'idem_markers_daily_default'";
inline constexpr const char* kDailyInsertHead =
    "INSERT INTO idem_markers_daily(consumer, id, fingerprint, processed_at_ms) VALUES ";
// Followed by "($1),($2),...": the keys, locked in order (no deadlocks).
inline constexpr const char* kDailyLockHead = "SELECT pg_advisory_xact_lock(k) FROM (VALUES ";
inline constexpr const char* kDailyLockTail = ") AS v(k) ORDER BY k";
inline constexpr const char* kDailyFindMarkersHead =
    "SELECT id, fingerprint FROM idem_markers_daily WHERE consumer = $1 AND id IN (";
inline constexpr const char* kDailyFindMarker =
    "SELECT fingerprint, processed_at_ms FROM idem_markers_daily WHERE consumer = $1 AND id = $2";
inline constexpr const char* kDailyPurgeMarkers =
    "DELETE FROM idem_markers_daily WHERE (consumer, id, processed_at_ms) IN ("
    " SELECT consumer, id, processed_at_ms FROM idem_markers_daily WHERE processed_at_ms < $1"
    " AND ($2 = '' OR consumer = $2) ORDER BY processed_at_ms LIMIT $3 FOR UPDATE SKIP LOCKED)";
inline constexpr const char* kDailyCountMarkers =
    "SELECT count(*) FROM idem_markers_daily WHERE ($1 = '' OR consumer = $1)";
inline constexpr const char* kDailyListMarkers =
    "SELECT consumer, id, fingerprint, processed_at_ms FROM idem_markers_daily WHERE ($1 = '' OR consumer = $1)"
    " ORDER BY processed_at_ms DESC LIMIT $2";

// Multi-row marker inserts are built as "INSERT ... VALUES ($1,$2,$3,$4),
// ($5,...) ON CONFLICT DO NOTHING RETURNING id" from these parts.
inline constexpr const char* kInsertMarkersHead =
    "INSERT INTO idem_markers(consumer, id, fingerprint, processed_at_ms) VALUES ";
inline constexpr const char* kInsertMarkersTail = " ON CONFLICT DO NOTHING RETURNING id";
inline constexpr const char* kInsertMarker =
    "INSERT INTO idem_markers(consumer, id, fingerprint, processed_at_ms) VALUES ($1, $2, $3, $4)"
    " ON CONFLICT DO NOTHING";
// Followed by "$2, $3, ...)" for the ids of a batch.
inline constexpr const char* kFindMarkersHead =
    "SELECT id, fingerprint FROM idem_markers WHERE consumer = $1 AND id IN (";
inline constexpr const char* kFindMarker =
    "SELECT fingerprint, processed_at_ms FROM idem_markers WHERE consumer = $1 AND id = $2";
// SKIP LOCKED: purgers running at once take disjoint rows, never wait on
// each other, never deadlock.
inline constexpr const char* kPurgeMarkers =
    "DELETE FROM idem_markers WHERE ctid IN ("
    " SELECT ctid FROM idem_markers WHERE processed_at_ms < $1 AND ($2 = '' OR consumer = $2)"
    " ORDER BY processed_at_ms LIMIT $3 FOR UPDATE SKIP LOCKED)";
inline constexpr const char* kCountMarkers = "SELECT count(*) FROM idem_markers WHERE ($1 = '' OR consumer = $1)";
inline constexpr const char* kListMarkers =
    "SELECT consumer, id, fingerprint, processed_at_ms FROM idem_markers WHERE ($1 = '' OR consumer = $1)"
    " ORDER BY processed_at_ms DESC LIMIT $2";

// ---- the outbox: 64 lanes, each leased by one relay at a time (a row of
// idem_outbox_lanes: renewed at each rebalance, free once it runs out, or at
// once when its holder's own connection to the server is gone); a
// transaction that adds rows locks their keys (advisory, until commit) so
// rows of one key take seq in commit order, and NOTIFYs only when a relay
// sleeps (a NOTIFY serialises commits).
#define IDEM_PG_CLOCK_MS "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
// A relay counts as alive while seen lately and, when it has a connection of
// its own (backend_pid 0: behind a transaction pooler, it has none), while
// that connection is open.
#define IDEM_PG_RELAY_ALIVE(r)                                                      \
  "(" r ".seen_at_ms >= " IDEM_PG_CLOCK_MS " - $2 AND (" r ".backend_pid = 0 OR " r \
  ".backend_pid IN (SELECT pid"                                                     \
  " FROM pg_stat_activity)))"
// ($1 lane, $2 holder, $3 lease ms) -> a row when taken (or renewed): free,
// run out, or its holder's connection gone.
inline constexpr const char* kTakeLane =
    "INSERT INTO idem_outbox_lanes AS l(lane, holder, until_ms) VALUES ($1, $2, " IDEM_PG_CLOCK_MS
    " + $3)"
    " ON CONFLICT (lane) DO UPDATE SET holder = excluded.holder, until_ms = excluded.until_ms"
    " WHERE l.holder = excluded.holder OR l.until_ms < " IDEM_PG_CLOCK_MS
    " OR NOT EXISTS (SELECT 1 FROM"
    " idem_outbox_relays r WHERE r.name = l.holder AND (r.backend_pid = 0 OR r.backend_pid IN (SELECT pid FROM"
    " pg_stat_activity))) RETURNING lane";
// ($1 holder, $2 lanes, $3 lease ms) -> the lanes still held.
inline constexpr const char* kRenewLanes = "UPDATE idem_outbox_lanes SET until_ms = " IDEM_PG_CLOCK_MS
                                           " + $3 WHERE holder = $1 AND lane = ANY($2::int[])"
                                           " RETURNING lane";
// ($1 lane, $2 holder)
inline constexpr const char* kFreeLane = "DELETE FROM idem_outbox_lanes WHERE lane = $1 AND holder = $2";

#define IDEM_PG_NO_SYNC "(SELECT set_config('synchronous_commit', 'off', true)) = 'off'"
// ($1 name, $2 lanes held, $3 now) with the relay's connection's backend.
#define IDEM_PG_HEARTBEAT(pid)                                                                                      \
  "INSERT INTO idem_outbox_relays(name, seen_at_ms, lanes, backend_pid) VALUES ($1, " IDEM_PG_CLOCK_MS ", $2, " pid \
  ") ON CONFLICT (name) DO UPDATE SET seen_at_ms = excluded.seen_at_ms, lanes = excluded.lanes,"                    \
  " backend_pid = excluded.backend_pid"
inline constexpr const char* kOutboxChannel = "idem_outbox";
inline constexpr sql_internal::OutboxSql kOutbox{
    .lanes = 64,
    .list_open = '{',
    .lock_keys =
        "SELECT pg_current_xact_id()::text, (SELECT count(*) FROM (SELECT pg_advisory_xact_lock(7317291, k)"
        " FROM unnest($1::int[]) AS u(k) ORDER BY k) l)",
    .insert_head =
        "WITH ins AS (INSERT INTO idem_outbox(lane, seq, id, destination, ordering_key, payload, headers,"
        " producer_time_ms, added_at_ms) SELECT lane, nextval('idem_outbox_seq'), id, destination, k,"
        " payload, headers, pt, at FROM (VALUES ",
    .insert_tail =
        ") AS v(lane, id, destination, k, payload, headers, pt, at) RETURNING 1) SELECT (SELECT count(*)"
        " FROM ins), (SELECT count(*) FROM (SELECT pg_notify('idem_outbox', '') FROM idem_outbox_relays"
        " WHERE asleep_until_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint LIMIT 1) n)",
    .fetch =
        "SELECT seq, id, destination, ordering_key, payload, headers, producer_time_ms, added_at_ms,"
        " attempts, lane FROM idem_outbox WHERE lane = ANY($1::int[]) ORDER BY seq LIMIT $2",
    .any_pending = "SELECT 1 FROM idem_outbox WHERE lane = ANY($1::int[]) LIMIT 1",
    .move_sent =
        "INSERT INTO idem_outbox_sent(seq, id, destination, ordering_key, payload, headers,"
        " producer_time_ms, added_at_ms, sent_at_ms) SELECT seq, id, destination, ordering_key, payload,"
        " headers, producer_time_ms, added_at_ms, $2 FROM idem_outbox WHERE seq = ANY($1::bigint[])",
    .delete_rows = "DELETE FROM idem_outbox WHERE seq = ANY($1::bigint[])",
    // A round that only sent: one statement each (no transaction around it),
    // with synchronous_commit off for that statement's own transaction (the
    // setting is made by an uncorrelated subquery, run once before the rows
    // are read, and ends with the statement).
    .move_sent_one =
        "WITH moved AS (DELETE FROM idem_outbox WHERE seq = ANY($1::bigint[]) AND " IDEM_PG_NO_SYNC
        " RETURNING seq,"
        " id, destination, ordering_key, payload, headers, producer_time_ms, added_at_ms) INSERT INTO"
        " idem_outbox_sent(seq, id, destination, ordering_key, payload, headers, producer_time_ms, added_at_ms,"
        " sent_at_ms) SELECT seq, id, destination, ordering_key, payload, headers, producer_time_ms, added_at_ms,"
        " $2::bigint FROM moved",
    .delete_sent_one = "DELETE FROM idem_outbox WHERE seq = ANY($1::bigint[]) AND " IDEM_PG_NO_SYNC,
    .put_dead =
        "INSERT INTO idem_outbox_dead(seq, id, destination, ordering_key, payload, headers,"
        " producer_time_ms, added_at_ms, attempts, reason, error, at_ms) SELECT seq, id, destination,"
        " ordering_key, payload, headers, producer_time_ms, added_at_ms, attempts + 1, $2, $3, $4 FROM"
        " idem_outbox WHERE seq = $1 ON CONFLICT DO NOTHING",
    .heartbeat = IDEM_PG_HEARTBEAT("pg_backend_pid()"),
    // Judged by the server's clock, and only relays whose connection is still
    // open count: a killed relay stops counting once the server sees it gone.
    .live_relays = "SELECT count(*) FROM idem_outbox_relays r WHERE " IDEM_PG_RELAY_ALIVE("r"),
    .handed_read = "SELECT lane, upto FROM idem_outbox_handed WHERE lane = ANY($1::int[])",
    .handed_write =
        "INSERT INTO idem_outbox_handed(lane, upto) SELECT * FROM unnest($1::int[], $2::bigint[]) ON CONFLICT"
        " (lane) DO UPDATE SET upto = GREATEST(idem_outbox_handed.upto, excluded.upto)",
    .stats =
        "SELECT (SELECT count(*) FROM idem_outbox), (SELECT added_at_ms FROM idem_outbox ORDER BY seq LIMIT 1),"
        " (SELECT count(*) FROM idem_outbox_dead), (SELECT count(*) FROM idem_outbox_sent), (SELECT count(*) FROM"
        " idem_outbox_relays r WHERE " IDEM_PG_RELAY_ALIVE("r") ")",
    // A relay's own connection, direct to the server: it waits with LISTEN.
    .session_setup = "LISTEN idem_outbox",
    // What a relay settles needs no sync (lost, it is only published again):
    // for its own transaction only, so nothing outlives it on a pooled
    // server session.
    .settle_prologue = "SELECT set_config('synchronous_commit', 'off', true)",
};

// Behind a transaction pooler: each statement may run on another server
// session, so the relay has no connection of its own to name (backend_pid
// 0: its lanes last as long as their leases), sets nothing up and polls.
constexpr sql_internal::OutboxSql Pooled(sql_internal::OutboxSql o) {
  o.heartbeat = IDEM_PG_HEARTBEAT("0");
  o.session_setup = "";
  return o;
}
inline constexpr sql_internal::OutboxSql kOutboxPooled = Pooled(kOutbox);

}  // namespace idem::pg_internal

#endif  // IDEM_SRC_POSTGRES_SCHEMA_H_
