// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: idem's tables on SQLite, and every statement that touches the
// markers. The marker's storage layout lives here and nowhere else, so a
// better layout changes this file only.
#ifndef IDEM_SRC_SQLITE_SCHEMA_H_
#define IDEM_SRC_SQLITE_SCHEMA_H_

#include "sql/sql_store.h"

namespace idem::sqlite_internal {

inline constexpr const char* kCreateMigrations =
    "CREATE TABLE IF NOT EXISTS idem_migrations("
    " version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at_ms INTEGER NOT NULL)";

inline constexpr sql_internal::Migration kMigrations[] = {
    {1, "markers, failure counts, dead letters",
     // One row per handled (consumer, message id). The primary key is the
     // arbiter of duplicates and races; the id is a BLOB so it is compared
     // byte for byte.
     "CREATE TABLE idem_markers("
     " consumer TEXT NOT NULL,"
     " id BLOB NOT NULL,"
     " fingerprint BLOB NOT NULL,"
     " processed_at_ms INTEGER NOT NULL,"
     " PRIMARY KEY (consumer, id)) WITHOUT ROWID;"
     "CREATE INDEX idem_markers_by_time ON idem_markers(processed_at_ms);"
     // Failure counts live outside the business transaction (written in a
     // transaction of their own after the rollback), so they survive it.
     "CREATE TABLE idem_failures("
     " consumer TEXT NOT NULL,"
     " id BLOB NOT NULL,"
     " attempts INTEGER NOT NULL,"
     " last_error TEXT NOT NULL,"
     " updated_at_ms INTEGER NOT NULL,"
     " PRIMARY KEY (consumer, id)) WITHOUT ROWID;"
     "CREATE TABLE idem_dead_letters("
     " consumer TEXT NOT NULL,"
     " id BLOB NOT NULL,"
     " reason TEXT NOT NULL,"
     " error TEXT NOT NULL,"
     " attempts INTEGER NOT NULL,"
     " payload BLOB NOT NULL,"
     " at_ms INTEGER NOT NULL,"
     " PRIMARY KEY (consumer, id)) WITHOUT ROWID;"},
    {2, "markers without the time index: purge walks the primary key in windows",
     // One B-tree write less per marker (measured in doc/performance.md).
     "DROP INDEX IF EXISTS idem_markers_by_time"},
    {3, "markers keyed by producer time first (Inbox::Options::key_by_producer_time)",
     // Time-ordered keys append at the end of the B-tree: one dirty page
     // per batch instead of one per marker.
     "CREATE TABLE idem_markers_by_producer_time("
     " produced_at_ms INTEGER NOT NULL,"
     " consumer TEXT NOT NULL,"
     " id BLOB NOT NULL,"
     " fingerprint BLOB NOT NULL,"
     " processed_at_ms INTEGER NOT NULL,"
     " PRIMARY KEY (produced_at_ms, consumer, id)) WITHOUT ROWID"},
    {4, "claims (two-phase mode) and their fencing counter",
     // state: 0 in progress, 1 completed. The fence counter is one row that
     // only grows; every claim that starts work takes its next value.
     "CREATE TABLE idem_claims("
     " scope TEXT NOT NULL,"
     " key BLOB NOT NULL,"
     " state INTEGER NOT NULL,"
     " fingerprint BLOB NOT NULL,"
     " fence INTEGER NOT NULL,"
     " lease_until_ms INTEGER NOT NULL,"
     " expires_at_ms INTEGER NOT NULL,"
     " result BLOB,"
     " result_is_error INTEGER NOT NULL,"
     " updated_at_ms INTEGER NOT NULL,"
     " PRIMARY KEY (scope, key)) WITHOUT ROWID;"
     "CREATE TABLE idem_claim_fence(one INTEGER PRIMARY KEY CHECK (one = 1), fence INTEGER NOT NULL);"
     "INSERT INTO idem_claim_fence VALUES (1, 0)"},
    {5, "versions for ApplyIfNewer (naturally idempotent, ordered updates)",
     "CREATE TABLE idem_versions(entity TEXT NOT NULL, key BLOB NOT NULL, version INTEGER NOT NULL,"
     " PRIMARY KEY (entity, key)) WITHOUT ROWID"},
    {6, "failures: since when a message has been in progress, and when it was parked",
     // A message whose step may have taken effect is never dead-lettered as
     // a failure: it is retried, and parked past Consumer::Options::park_after_ms.
     "ALTER TABLE idem_failures ADD COLUMN in_progress_since_ms INTEGER;"
     "ALTER TABLE idem_failures ADD COLUMN parked_at_ms INTEGER"},
    {7, "the transactional outbox: messages to publish, sent, dead; relays",
     // seq comes from a counter that only grows (one update per
     // transaction that adds), so a key's messages keep their order and
     // idem-outbox-seq only grows, even after every row was sent.
     "CREATE TABLE idem_outbox(seq INTEGER PRIMARY KEY, lane INTEGER NOT NULL, id BLOB NOT NULL,"
     " destination TEXT NOT NULL, ordering_key BLOB NOT NULL, payload BLOB NOT NULL, headers BLOB NOT NULL,"
     " producer_time_ms INTEGER NOT NULL, added_at_ms INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
     " last_error TEXT);"
     "CREATE TABLE idem_outbox_sent(seq INTEGER PRIMARY KEY, id BLOB NOT NULL, destination TEXT NOT NULL,"
     " ordering_key BLOB NOT NULL, payload BLOB NOT NULL, headers BLOB NOT NULL, producer_time_ms INTEGER NOT NULL,"
     " added_at_ms INTEGER NOT NULL, sent_at_ms INTEGER NOT NULL);"
     "CREATE TABLE idem_outbox_dead(seq INTEGER PRIMARY KEY, id BLOB NOT NULL, destination TEXT NOT NULL,"
     " ordering_key BLOB NOT NULL, payload BLOB NOT NULL, headers BLOB NOT NULL, producer_time_ms INTEGER NOT NULL,"
     " added_at_ms INTEGER NOT NULL, attempts INTEGER NOT NULL, reason TEXT NOT NULL, error TEXT NOT NULL,"
     " at_ms INTEGER NOT NULL);"
     "CREATE TABLE idem_outbox_relays(name TEXT PRIMARY KEY, seen_at_ms INTEGER NOT NULL, lanes INTEGER NOT NULL,"
     " asleep_until_ms INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;"
     "CREATE TABLE idem_outbox_handed(lane INTEGER PRIMARY KEY, upto INTEGER NOT NULL);"
     "CREATE TABLE idem_outbox_counter(one INTEGER PRIMARY KEY CHECK (one = 1), seq INTEGER NOT NULL);"
     "INSERT INTO idem_outbox_counter VALUES (1, 0)"},
};

// ---- claims. The store's clock is the Env's (SQLite is local): `now` is
// always a parameter. Writes that take a fence run in a transaction that
// first bumps the counter.
inline constexpr sql_internal::ClaimsSql kClaims{
    .select =
        "SELECT state, fingerprint, fence, lease_until_ms, expires_at_ms, result, result_is_error,"
        " updated_at_ms, $3 FROM idem_claims WHERE scope = $1 AND key = $2",
    .insert =
        "INSERT INTO idem_claims VALUES ($1, $2, 0, $3, (SELECT fence FROM idem_claim_fence), $5 + $4, 0,"
        " NULL, 0, $5) ON CONFLICT DO NOTHING RETURNING fence, lease_until_ms",
    .take_over =
        "UPDATE idem_claims SET state = 0, fingerprint = $3, fence = (SELECT fence FROM idem_claim_fence),"
        " lease_until_ms = $5 + $4, expires_at_ms = 0, result = NULL, result_is_error = 0,"
        " updated_at_ms = $5 WHERE scope = $1 AND key = $2 AND fence = $6 AND state = $7"
        " AND CASE state WHEN 0 THEN lease_until_ms <= $5 ELSE expires_at_ms <= $5 END"
        " RETURNING fence, lease_until_ms",
    .bump_fence = "UPDATE idem_claim_fence SET fence = fence + 1",
    .complete =
        "UPDATE idem_claims SET state = 1, result = $4, result_is_error = $5, expires_at_ms = $7 + $6,"
        " updated_at_ms = $7 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 0 RETURNING 1",
    .release = "DELETE FROM idem_claims WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 0 RETURNING 1",
    .extend =
        "UPDATE idem_claims SET lease_until_ms = $5 + $4, updated_at_ms = $5"
        " WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 0 RETURNING lease_until_ms",
    .find = sql_internal::kFindClaim,
    .list = sql_internal::kListClaims,
    .purge =
        "DELETE FROM idem_claims WHERE (scope, key) IN (SELECT scope, key FROM idem_claims"
        " WHERE ($1 = '' OR scope = $1) AND ((state = 1 AND expires_at_ms <= $4)"
        " OR (state = 0 AND lease_until_ms + $2 <= $4)) LIMIT $3)",
    .now = "SELECT $1",
    .reserve_fences = "UPDATE idem_claim_fence SET fence = fence + $1 RETURNING fence",
    .insert_fenced =
        "INSERT INTO idem_claims VALUES ($1, $2, 0, $3, $6, $5 + $4, 0, NULL, 0, $5) ON CONFLICT DO NOTHING"
        " RETURNING fence, lease_until_ms",
};

inline constexpr const char* kInsertMarker =
    "INSERT INTO idem_markers(consumer, id, fingerprint, processed_at_ms) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT DO NOTHING";
inline constexpr const char* kFindMarker =
    "SELECT fingerprint, processed_at_ms FROM idem_markers WHERE consumer = $1 AND id = $2";
// Purge walks the primary key in windows of at most `batch` rows, one short
// write transaction each, deleting the old ones it finds: deletes in key
// order touch neighbouring pages, and no time index is kept for it.
inline constexpr const char* kPurgeWindowAll =
    "SELECT consumer, id, processed_at_ms FROM idem_markers WHERE (consumer, id) > ($1, $2)"
    " ORDER BY consumer, id LIMIT $3";
inline constexpr const char* kPurgeWindowOne =
    "SELECT consumer, id, processed_at_ms FROM idem_markers WHERE consumer = $1 AND id > $2"
    " ORDER BY id LIMIT $3";
inline constexpr const char* kDeleteMarker = "DELETE FROM idem_markers WHERE consumer = $1 AND id = $2";
inline constexpr const char* kCountMarkers =
    "SELECT (SELECT count(*) FROM idem_markers WHERE ($1 = '' OR consumer = $1))"
    " + (SELECT count(*) FROM idem_markers_by_producer_time WHERE ($1 = '' OR consumer = $1))";
inline constexpr const char* kListMarkers =
    "SELECT consumer, id, fingerprint, processed_at_ms FROM idem_markers WHERE ($1 = '' OR consumer = $1)"
    " UNION ALL SELECT consumer, id, fingerprint, processed_at_ms FROM idem_markers_by_producer_time"
    " WHERE ($1 = '' OR consumer = $1) ORDER BY processed_at_ms DESC LIMIT $2";

// ---- markers keyed by producer time
inline constexpr const char* kInsertByTime =
    "INSERT INTO idem_markers_by_producer_time(produced_at_ms, consumer, id, fingerprint, processed_at_ms)"
    " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING";
inline constexpr const char* kFindByTime =
    "SELECT fingerprint, processed_at_ms FROM idem_markers_by_producer_time"
    " WHERE produced_at_ms = $1 AND consumer = $2 AND id = $3";
inline constexpr const char* kDeleteByTime =
    "DELETE FROM idem_markers_by_producer_time WHERE produced_at_ms = $1 AND consumer = $2 AND id = $3";
// Purged by producer time, oldest first, in key order.
inline constexpr const char* kPurgeByTime =
    "DELETE FROM idem_markers_by_producer_time WHERE (produced_at_ms, consumer, id) IN ("
    " SELECT produced_at_ms, consumer, id FROM idem_markers_by_producer_time WHERE produced_at_ms < $1"
    " AND ($2 = '' OR consumer = $2) ORDER BY produced_at_ms LIMIT $3)";

// ---- the outbox: one lane (one relay at a time per file, by flock); the
// rows commit in seq order (one writer), so no lock per key.
inline constexpr sql_internal::OutboxSql kOutbox{
    .lanes = 1,
    .list_open = '[',
    .lock_keys = nullptr,
    .insert_head =
        "INSERT INTO idem_outbox(lane, id, destination, ordering_key, payload, headers, producer_time_ms,"
        " added_at_ms) VALUES ",
    .insert_tail = "",
    .insert_one =
        "INSERT INTO idem_outbox(lane, id, destination, ordering_key, payload, headers, producer_time_ms,"
        " added_at_ms, seq) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    // Read, then advanced without RETURNING: a RETURNING clause runs as a
    // trigger, which with the CHECK gives the UPDATE a statement journal
    // (allocated and freed on every flush).
    .read_seq = "SELECT seq FROM idem_outbox_counter WHERE one = 1",
    .advance_seq = "UPDATE idem_outbox_counter SET seq = seq + $1 WHERE one = 1",
    .fetch =
        "SELECT seq, id, destination, ordering_key, payload, headers, producer_time_ms, added_at_ms,"
        " attempts, lane FROM idem_outbox WHERE lane IN (SELECT value FROM json_each($1)) ORDER BY seq LIMIT"
        " $2",
    .any_pending = "SELECT 1 FROM idem_outbox WHERE lane IN (SELECT value FROM json_each($1)) LIMIT 1",
    .move_sent =
        "INSERT INTO idem_outbox_sent(seq, id, destination, ordering_key, payload, headers,"
        " producer_time_ms, added_at_ms, sent_at_ms) SELECT seq, id, destination, ordering_key, payload,"
        " headers, producer_time_ms, added_at_ms, $2 FROM idem_outbox WHERE seq IN (SELECT value FROM"
        " json_each($1))",
    .delete_rows = "DELETE FROM idem_outbox WHERE seq IN (SELECT value FROM json_each($1))",
    .put_dead =
        "INSERT INTO idem_outbox_dead(seq, id, destination, ordering_key, payload, headers,"
        " producer_time_ms, added_at_ms, attempts, reason, error, at_ms) SELECT seq, id, destination,"
        " ordering_key, payload, headers, producer_time_ms, added_at_ms, attempts + 1, $2, $3, $4 FROM"
        " idem_outbox WHERE seq = $1 ON CONFLICT DO NOTHING",
    .heartbeat =
        "INSERT INTO idem_outbox_relays(name, seen_at_ms, lanes) VALUES ($1, $3, $2) ON CONFLICT (name) DO"
        " UPDATE SET seen_at_ms = excluded.seen_at_ms, lanes = excluded.lanes",
    .live_relays = "SELECT count(*) FROM idem_outbox_relays WHERE seen_at_ms >= $1 - $2",
    .handed_read = "SELECT lane, upto FROM idem_outbox_handed WHERE lane IN (SELECT value FROM json_each($1))",
    .handed_write =
        "INSERT INTO idem_outbox_handed(lane, upto) SELECT l.value, u.value FROM json_each($1) l JOIN"
        " json_each($2) u ON u.key = l.key WHERE true ON CONFLICT (lane) DO UPDATE SET upto ="
        " max(idem_outbox_handed.upto, excluded.upto)",
    .stats =
        "SELECT (SELECT count(*) FROM idem_outbox), (SELECT added_at_ms FROM idem_outbox ORDER BY seq LIMIT"
        " 1), (SELECT count(*) FROM idem_outbox_dead), (SELECT count(*) FROM idem_outbox_sent), (SELECT"
        " count(*) FROM idem_outbox_relays WHERE seen_at_ms >= $1 - $2)",
    .session_setup = "",  // the connection is opened with synchronous=NORMAL (ConnectRelay)
};

}  // namespace idem::sqlite_internal

#endif  // IDEM_SRC_SQLITE_SCHEMA_H_
