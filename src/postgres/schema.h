// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: idem's tables on PostgreSQL and every statement that touches the
// markers. The marker's storage layout lives here and nowhere else.
#ifndef IDEM_SRC_POSTGRES_SCHEMA_H_
#define IDEM_SRC_POSTGRES_SCHEMA_H_

#include <cstdint>

#include "core/sql_store.h"

namespace idem::pg_internal {


// Serialises migrations between processes opening the same database.
inline constexpr const char* kMigrationLock = "SELECT pg_advisory_xact_lock(7317283)";

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
};

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

}  // namespace idem::pg_internal

#endif  // IDEM_SRC_POSTGRES_SCHEMA_H_
