// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: idem's tables on PostgreSQL and every statement that touches the
// markers. The marker's storage layout lives here and nowhere else.
#ifndef IDEM_SRC_POSTGRES_SCHEMA_H_
#define IDEM_SRC_POSTGRES_SCHEMA_H_

#include "core/sql_store.h"

namespace idem::pg_internal {

inline constexpr int kSchemaVersion = 1;

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
};

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
inline constexpr const char* kDeleteMarker = "DELETE FROM idem_markers WHERE consumer = $1 AND id = $2";
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
