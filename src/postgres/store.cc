// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/postgres/store.h"
#include "idem/store_backend.h"

#include "core/kill_point.h"
#include "idem/env.h"
#include "idem/url.h"

#include <poll.h>
#include <cctype>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "postgres/pg.h"
#include "postgres/schema.h"
#include "sql/flights.h"
#include "sql/sql_store.h"

namespace idem::postgres {
namespace {

using Options = Store::Options;
using pg_internal::Conn;
using sql_internal::FingerprintBlob;
using sql_internal::IdBlob;
using sql_internal::ToFingerprint;

// Store::Options::ack_after: what a COMMIT must also have before it counts.
struct AckGate {
  bool standby_flush = false;
  int64_t wait_ms = 0;
  Env* env = nullptr;
};

// Waits until a standby has flushed the WAL written so far on `c`'s server
// (so the commit just made, or a marker just read, is on a standby too):
// kInDoubt when none has within the gate's time, or when the role cannot
// read the standbys' positions.
Status AwaitStandby(Conn& c, const AckGate& gate, std::string_view what) {
  IDEM_ASSIGN_OR_RETURN(pg_internal::ResultPtr at, c.Exec(pg_internal::kWalWrittenLsn, {}));
  const Rows lsn = pg_internal::ToRows(at.get());
  if (lsn.rows.empty()) return Status::InDoubt(std::string(what) + ": the primary's WAL position could not be read");
  const std::string wal = lsn.rows[0][0].AsText();
  const int64_t deadline = gate.env->NowMs() + gate.wait_ms;
  for (int round = 0;; ++round) {
    Value p[] = {wal};
    IDEM_ASSIGN_OR_RETURN(pg_internal::ResultPtr r, c.Exec(pg_internal::kStandbysFlushed, p));
    const Rows n = pg_internal::ToRows(r.get());
    const int64_t flushed = n.rows.empty() ? 0 : n.rows[0][0].AsInt();
    const int64_t hidden = n.rows.empty() ? 0 : n.rows[0][1].AsInt();
    if (flushed > 0) return Status::OK();
    if (hidden > 0)
      return Status::InDoubt(std::string(what) + " at WAL " + wal +
                             ": this role cannot read pg_stat_replication's positions (idem_ack_after=standby_flush "
                             "needs GRANT pg_monitor), so it is not counted as on a standby");
    if (gate.env->NowMs() >= deadline)
      return Status::InDoubt(std::string(what) + " on the primary at WAL " + wal +
                             ", but no standby flushed it within " + std::to_string(gate.wait_ms) +
                             " ms (idem_ack_after=standby_flush): not acknowledged until one has");
    gate.env->SleepMs(round < 10 ? 1 : 10);
  }
}

// A notice during COMMIT that the wait for the synchronous standby was
// cancelled (statement_timeout, a cancel, a terminated backend): the
// transaction committed on the primary alone.
void NoteCommitNotice(void* arg, const PGresult* res) {
  const char* m = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  if (m != nullptr && (std::strstr(m, "canceling wait for synchronous replication") != nullptr ||
                       std::strstr(m, "canceling the wait for synchronous replication") != nullptr))
    *static_cast<bool*>(arg) = true;
}

class PgConnection final : public sql_internal::Connection {
 public:
  using Statement = pg_internal::Conn::Statement;
  PgConnection(std::unique_ptr<Conn> c, AckGate gate) : c_(std::move(c)), gate_(gate) {}
  Result<int64_t> Exec(std::string_view sql, std::span<const Value> params) override {
    IDEM_ASSIGN_OR_RETURN(pg_internal::ResultPtr r, Run(sql, params));
    return pg_internal::AffectedRows(r.get());
  }
  Result<Rows> Query(std::string_view sql, std::span<const Value> params) override {
    IDEM_ASSIGN_OR_RETURN(pg_internal::ResultPtr r, Run(sql, params));
    return pg_internal::ToRows(r.get());
  }
  // All in one round trip (with a held-back BEGIN and held statements in front).
  Result<std::vector<Rows>> QueryMany(std::string_view sql, std::span<const std::vector<Value>> each) override {
    if (!begin_failed_.ok()) return begin_failed_;
    if (each.empty()) return std::vector<Rows>();  // nothing to send: a held-back BEGIN stays held
    std::vector<Statement> statements;
    for (const auto& params : each) statements.push_back(Statement{sql, params});
    IDEM_ASSIGN_OR_RETURN(auto results, Send(statements));
    std::vector<Rows> out;
    out.reserve(results.size());
    for (const auto& r : results) out.push_back(pg_internal::ToRows(r.get()));
    return out;
  }
  // Statements (they may differ) outside any transaction, in one flight:
  // the protocol runs them in one implicit transaction, which the flight's
  // sync commits (or, when one fails, rolls back whole).
  Result<std::vector<Rows>> QueryTogether(std::span<const Statement> statements) {
    if (InTransaction()) return Status::Internal("QueryTogether inside a transaction");
    IDEM_ASSIGN_OR_RETURN(auto results, c_->ExecFlight("", statements));
    std::vector<Rows> out;
    out.reserve(results.size());
    for (const auto& r : results) out.push_back(pg_internal::ToRows(r.get()));
    return out;
  }
  bool Defer(std::string_view sql, std::span<const Value> params) override {
    if (!begin_ && !c_->in_transaction()) return false;  // only inside a transaction
    held_.push_back(Held{std::string(sql), std::vector<Value>(params.begin(), params.end())});
    return true;
  }
  Status SendDeferred() override { return SendHeld(); }
  Status Script(std::string_view sql) override {
    if (sql == "ROLLBACK") {  // they go with the transaction, unsent
      held_.clear();
      held_failed_ = Status::OK();
    }
    IDEM_RETURN_IF_ERROR(SendHeld());
    if (sql == "ROLLBACK" || sql == "BEGIN") {
      // The transaction ends (or a new one starts): a failed held-back BEGIN
      // is forgotten, and with nothing open on the server nothing is sent.
      const bool failed = !begin_failed_.ok();
      begin_failed_ = Status::OK();
      if (sql == "ROLLBACK" && (begin_ || failed) && !c_->in_transaction()) {
        begin_ = false;
        return Status::OK();
      }
    }
    if (begin_) {
      begin_ = false;
      Status began = c_->Script("BEGIN");
      BeganOrNot(began);
      IDEM_RETURN_IF_ERROR(began);
    }
    return c_->Script(sql);
  }
  bool DeferBegin(std::string_view sql) override {
    begin_failed_ = Status::OK();
    begin_ = sql == "BEGIN";
    return begin_;
  }
  // With ack_after = standby_flush, a transaction counts as committed only
  // once a standby has the WAL up to its end: also one that wrote nothing
  // (its duplicates were judged against markers a standby may not have yet).
  Status Commit() override {
    IDEM_RETURN_IF_ERROR(CommitOnPrimary());
    return gate_.standby_flush ? AwaitStandby("committed") : Status::OK();
  }
  Status CommitOnPrimary() {
    if (Status held = SendHeld(); !held.ok()) {
      // Rows of this transaction were not written: it ends here, rolled back.
      if (c_->healthy() && c_->in_transaction()) (void)c_->Script("ROLLBACK");
      begin_failed_ = Status::OK();
      held_failed_ = Status::OK();
      held_.clear();
      return held;
    }
    // Whatever happens below, the transaction ends here.
    const Status began = std::exchange(begin_failed_, Status::OK());
    if (!began.ok()) return began.WithContext("the transaction never began");
    if (begin_) {  // nothing was sent, so there is nothing to commit
      begin_ = false;
      return Status::OK();
    }
    PGconn* c = c_->raw();
    IDEM_KILL_POINT("postgres.round_trip");
    bool sync_wait_cancelled = false;
    struct Restore {  // libpq's receiver (which hands notices to the ignoring processor) again
      PGconn* c;
      PQnoticeReceiver was;
      ~Restore() { PQsetNoticeReceiver(c, was, nullptr); }
    } restore{c, PQsetNoticeReceiver(c, NoteCommitNotice, &sync_wait_cancelled)};
    if (PQsendQuery(c, "COMMIT") != 1)
      return Status::Unavailable("cannot send COMMIT: " + std::string(PQerrorMessage(c)));
    // The window where the server may commit while the client never learns
    // of it (crash tests cut the connection here).
    IDEM_KILL_POINT("postgres.commit_sent");
    pg_internal::ResultPtr last;
    while (PGresult* r = PQgetResult(c)) last.reset(r);
    if (!c_->healthy() || last == nullptr) {
      // The connection died while committing: the server may or may not
      // have committed. Only reading the marker can tell.
      return Status::InDoubt("connection lost during COMMIT: " + std::string(PQerrorMessage(c)));
    }
    IDEM_RETURN_IF_ERROR(pg_internal::Translate(last.get(), c, "COMMIT"));
    // COMMIT of a transaction that an earlier error aborted answers ROLLBACK.
    if (std::string_view(PQcmdStatus(last.get())) != "COMMIT")
      return Status::Aborted("COMMIT rolled back: an earlier statement in the transaction failed");
    if (sync_wait_cancelled)
      return Status::InDoubt(
          "COMMIT: the wait for the synchronous standby was cancelled, so the transaction is committed on the "
          "primary alone, where a failover can lose it");
    return Status::OK();
  }
  // A transaction whose held-back BEGIN failed is still one until it ends
  // (ROLLBACK, Commit): until then the connection must not be pooled.
  bool InTransaction() const override {
    return begin_ || !begin_failed_.ok() || !held_.empty() || !held_failed_.ok() || c_->in_transaction();
  }
  bool Healthy() const override { return c_->healthy(); }
  Status AwaitStandby(std::string_view what) { return postgres::AwaitStandby(*c_, gate_, what); }
  void* Native() override {
    // Whoever takes the handle expects the transaction to have begun. If
    // BEGIN fails here, the transaction can only fail: whatever was run on
    // the handle ran outside it.
    if (begin_) {
      begin_ = false;
      begin_failed_ = c_->Script("BEGIN");
    }
    // Held statements go now; one that fails leaves the transaction only
    // able to fail (held_failed_).
    (void)SendHeld();
    return c_->raw();
  }

 private:
  struct Held {
    std::string sql;
    std::vector<Value> params;
  };

  // A held-back BEGIN and held statements go with the first statement, in
  // one round trip.
  Result<pg_internal::ResultPtr> Run(std::string_view sql, std::span<const Value> params) {
    if (!begin_failed_.ok()) return begin_failed_;
    if (!held_failed_.ok()) return held_failed_;
    if (!begin_ && held_.empty()) return c_->Exec(sql, params);
    const Statement last{sql, params};
    IDEM_ASSIGN_OR_RETURN(auto results, Send(std::span<const Statement>(&last, 1)));
    return std::move(results.back());
  }
  // `statements` after the held-back BEGIN and the held ones, in one flight:
  // their own results (the held ones' only say they succeeded).
  // A flight that carried held statements and failed, whether or not it
  // went out, leaves the transaction only able to fail: they are not sent
  // again, and must not be lost at a COMMIT that succeeds without them.
  Result<std::vector<pg_internal::ResultPtr>> Send(std::span<const Statement> statements) {
    if (!begin_failed_.ok()) return begin_failed_;
    if (!held_failed_.ok()) return held_failed_;
    if (held_.empty() && statements.empty()) return std::vector<pg_internal::ResultPtr>();
    std::vector<Held> held = std::move(held_);
    held_.clear();
    std::vector<Statement> all;
    all.reserve(held.size() + statements.size());
    for (const Held& h : held) all.push_back(Statement{h.sql, h.params});
    all.insert(all.end(), statements.begin(), statements.end());
    const bool begin = begin_;
    begin_ = false;
    auto results = c_->ExecFlight(begin ? "BEGIN" : "", all);
    if (begin) BeganOrNot(results.status());
    if (!results.ok() && !held.empty() && begin_failed_.ok()) held_failed_ = results.status();
    IDEM_RETURN_IF_ERROR(results.status());
    results->erase(results->begin(), results->begin() + static_cast<std::ptrdiff_t>(held.size()));
    return results;
  }
  // The held statements on their own (before a script or COMMIT).
  Status SendHeld() {
    if (!held_failed_.ok()) return held_failed_;
    if (held_.empty()) return Status::OK();
    return Send({}).status();
  }
  // After a flight that carried the held-back BEGIN failed: if the
  // connection is up but outside a transaction, BEGIN itself failed, and
  // the statements that follow must not run on their own (autocommit).
  void BeganOrNot(const Status& flight) {
    if (!flight.ok() && c_->healthy() && !c_->in_transaction()) begin_failed_ = flight;
  }

  std::unique_ptr<Conn> c_;
  AckGate gate_;
  std::vector<Held> held_;  // statements held back until the next one (Defer)
  bool begin_ = false;      // BEGIN held back until the first statement
  Status begin_failed_;     // the held-back BEGIN failed: this transaction can only fail
  Status held_failed_;      // a flight with held statements failed: the same
};

constexpr sql_internal::Dialect kDialect{
    .kind = "postgres",
    .begin = "BEGIN",
    .migration_lock = pg_internal::kMigrationLock,
    .create_migrations = pg_internal::kCreateMigrations,
    .migrations = pg_internal::kMigrations,
    .insert_marker = pg_internal::kInsertMarker,
    .insert_markers_head = pg_internal::kInsertMarkersHead,
    .insert_markers_tail = pg_internal::kInsertMarkersTail,
    .find_markers_head = pg_internal::kFindMarkersHead,
    .find_marker = pg_internal::kFindMarker,
    .purge_markers = pg_internal::kPurgeMarkers,
    .count_markers = pg_internal::kCountMarkers,
    .list_markers = pg_internal::kListMarkers,
    .claims = &pg_internal::kClaims,
    .outbox = &pg_internal::kOutbox,
    .bound_lock_waits = pg_internal::kBoundLockWaits,
};

constexpr sql_internal::Dialect kDailyDialect{
    .kind = "postgres",
    .begin = "BEGIN",
    .migration_lock = pg_internal::kMigrationLock,
    .create_migrations = pg_internal::kCreateMigrations,
    .migrations = pg_internal::kMigrations,
    .insert_marker = "",  // InsertMarkers is PgStore's own in this layout
    .find_marker = pg_internal::kDailyFindMarker,
    .purge_markers = pg_internal::kDailyPurgeMarkers,
    .count_markers = pg_internal::kDailyCountMarkers,
    .list_markers = pg_internal::kDailyListMarkers,
    .claims = &pg_internal::kClaims,
    .outbox = &pg_internal::kOutbox,
    .bound_lock_waits = pg_internal::kBoundLockWaits,
};

// A relay's lane: a lease in idem_outbox_lanes, held until the time this
// process last learned it runs out (less a margin for the round trip and
// the clocks' drift); freed when the session ends.
constexpr int64_t kLaneLeaseMs = 10'000;
constexpr int64_t kLaneMarginMs = 2'000;

class LeaseLane final : public sql_internal::SqlStore::LaneLock {
 public:
  LeaseLane(sql_internal::Connection& c, Env& env, int lane, std::string holder, int64_t asked_at_ms)
      : c_(c), env_(env), lane_(lane), holder_(std::move(holder)) {
    Renewed(asked_at_ms);
  }
  ~LeaseLane() override {
    if (!c_.Healthy()) return;
    Value p[] = {lane_, holder_};
    (void)c_.Exec(pg_internal::kFreeLane, p);
  }
  bool Held() override { return c_.Healthy() && env_.NowMs() < held_until_ms_; }
  // The lease was renewed by a statement sent at `asked_at_ms`.
  void Renewed(int64_t asked_at_ms) { held_until_ms_ = asked_at_ms + kLaneLeaseMs - kLaneMarginMs; }

 private:
  sql_internal::Connection& c_;
  Env& env_;
  int lane_;
  std::string holder_;
  int64_t held_until_ms_ = 0;
};

// The advisory-lock key of (consumer, id): 64 bits of SHA-256. A collision
// only serialises two unrelated keys; the existence check compares real ids.
int64_t LockKey(const Marker& m) {
  std::string k = m.consumer;
  k += '\0';
  k += m.id;
  Fingerprint fp = FingerprintOf(k);
  int64_t v = 0;
  std::memcpy(&v, fp.data(), sizeof v);
  return v;
}

// A bounded wait's watch: a pooled connection that LISTENs on the claims
// channel; completions and releases NOTIFY it (from any process) with
// "<scope>:<hex key>".
class PgWatch final : public ClaimStore::Watch {
 public:
  PgWatch(sql_internal::Lease conn, std::string payload) : conn_(std::move(conn)), payload_(std::move(payload)) {}
  ~PgWatch() override {
    if (conn_->Healthy()) (void)conn_->Script(std::string("UNLISTEN ") + pg_internal::kClaimsChannel);
  }
  void Wait(int64_t max_wait_ms) override {
    auto* c = static_cast<PGconn*>(conn_->Native());
    if (Drain(c)) return;
    pollfd pfd{PQsocket(c), POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(max_wait_ms, 60'000))) > 0 && PQconsumeInput(c) == 1)
      Drain(c);
  }

 private:
  // Consumes the notifications that arrived; whether one was for our key.
  bool Drain(PGconn* c) {
    bool hit = false;
    while (PGnotify* n = PQnotifies(c)) {
      hit = hit || payload_ == n->extra;
      PQfreemem(n);
    }
    return hit;
  }
  sql_internal::Lease conn_;
  std::string payload_;
};

std::string HexOf(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char ch : bytes) {
    out += kHex[ch >> 4];
    out += kHex[ch & 15];
  }
  return out;
}

class PgStore final : public sql_internal::SqlStore {
 public:
  explicit PgStore(const Options& o)
      : SqlStore(o.partition_by_day ? kDailyDialect : kDialect, o.env, o.pool_size), options_(o) {}

  std::unique_ptr<Watch> WatchKey(std::string_view scope, std::string_view key) override {
    // A LISTEN lives in the server session, which a transaction pooler hands
    // to others: poll there.
    if (pooled_.load() == 1) return ClaimStore::WatchKey(scope, key);
    auto conn = Take();
    if (conn.ok() && (*conn)->Script(std::string("LISTEN ") + pg_internal::kClaimsChannel).ok()) {
      Value p[] = {std::string(scope), sql_internal::IdBlob(key)};
      // Registered before the caller reads the key: a completion after that
      // read sees the waiter and notifies (if the record is not there yet, the
      // poll covers it).
      if ((*conn)->Exec(pg_internal::kAddWaiter, p).ok())
        return std::make_unique<PgWatch>(std::move(*conn), std::string(scope) + ":" + HexOf(key));
    }
    return ClaimStore::WatchKey(scope, key);  // polling still finds the result
  }

  Result<std::unique_ptr<LaneLock>> LockLane(sql_internal::Connection& c, int lane, std::string_view holder) override {
    const int64_t asked = env()->NowMs();
    Value p[] = {lane, std::string(holder), kLaneLeaseMs};
    IDEM_ASSIGN_OR_RETURN(Rows r, c.Query(pg_internal::kTakeLane, p));
    if (r.rows.empty()) return std::unique_ptr<LaneLock>();
    return std::unique_ptr<LaneLock>(new LeaseLane(c, *env(), lane, std::string(holder), asked));
  }

  Status RenewLanes(sql_internal::Connection& c, std::string_view holder,
                    std::map<int, std::unique_ptr<LaneLock>>& locks) override {
    if (locks.empty()) return Status::OK();
    std::string lanes = "{";
    for (const auto& [lane, lock] : locks) lanes += (lanes.size() > 1 ? "," : "") + std::to_string(lane);
    lanes += "}";
    const int64_t asked = env()->NowMs();
    Value p[] = {std::string(holder), lanes, kLaneLeaseMs};
    IDEM_ASSIGN_OR_RETURN(Rows r, c.Query(pg_internal::kRenewLanes, p));
    std::set<int> held;
    for (const auto& row : r.rows) held.insert(static_cast<int>(row[0].AsInt()));
    for (auto it = locks.begin(); it != locks.end();) {
      if (!held.count(it->first)) {
        it = locks.erase(it);  // taken over: its row is another's now
        continue;
      }
      static_cast<LeaseLane*>(it->second.get())->Renewed(asked);
      ++it;
    }
    return Status::OK();
  }

  const sql_internal::OutboxSql& outbox_sql() override {
    return pooled_.load() == 1 ? pg_internal::kOutboxPooled : pg_internal::kOutbox;
  }

  // Asleep: flag the relay's row, so commits that add rows NOTIFY (only
  // those: a NOTIFY serialises commits); wait for the transactions that
  // were running when the flag committed (each may have read it before), so
  // that the look that follows sees their rows; then listen.
  // Behind a transaction pooler LISTEN is not the relay's: it polls (every
  // 50 ms, SqlStore's wait).
  Status WaitForOutbox(sql_internal::Connection& c, std::string_view name, int64_t timeout_ms,
                       const std::function<Result<bool>()>& pending) override {
    if (pooled_.load() == 1) return SqlStore::WaitForOutbox(c, name, timeout_ms, pending);
    auto* pg = static_cast<PGconn*>(c.Native());
    Value flag[] = {std::string(name), timeout_ms + 1000};
    IDEM_RETURN_IF_ERROR(c.Exec("UPDATE idem_outbox_relays SET asleep_until_ms ="
                                " (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $2 WHERE name = $1",
                                flag)
                             .status());
    IDEM_ASSIGN_OR_RETURN(Rows xip,
                          c.Query("SELECT array_agg(x)::text FROM pg_snapshot_xip(pg_current_snapshot()) x", {}));
    int64_t wait_ms = timeout_ms;
    if (!xip.rows.empty() && !xip.rows[0][0].is_null()) {
      Value list[] = {xip.rows[0][0].AsText()};
      bool done = false;
      for (int i = 0; i < 20 && !done; ++i) {
        IDEM_ASSIGN_OR_RETURN(Rows n, c.Query("SELECT count(*) FROM unnest($1::xid8[]) x"
                                              " WHERE pg_xact_status(x) = 'in progress'",
                                              list));
        done = n.rows.empty() || n.rows[0][0].AsInt() == 0;
        if (!done) env()->SleepMs(1);
      }
      if (!done) wait_ms = std::min<int64_t>(wait_ms, 50);  // a long transaction: look again soon
    }
    auto awake = [&]() {
      Value p[] = {std::string(name)};
      return c.Exec("UPDATE idem_outbox_relays SET asleep_until_ms = 0 WHERE name = $1", p).status();
    };
    // Notifications from before the flag are stale: the look below covers them.
    if (PQconsumeInput(pg) == 1)
      while (PGnotify* n = PQnotifies(pg)) PQfreemem(n);
    IDEM_ASSIGN_OR_RETURN(bool any, pending());
    if (!any) {
      pollfd pfd{PQsocket(pg), POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(wait_ms, 60'000))) > 0 && PQconsumeInput(pg) == 1)
        while (PGnotify* n = PQnotifies(pg)) PQfreemem(n);
    }
    return awake();
  }

  // Claim statements of concurrent callers, each committed on its own
  // otherwise: a caller flies at once, alone, while fewer flights are out
  // than the pool keeps connections (Options::pool_size), as it did before.
  // Past that, where it would open a connection of its own and close it
  // after, it joins the next flight instead, which sends up to kMaxGroup
  // statements in one pipeline whose statements form one implicit
  // transaction: one round trip and one commit for the group. Each
  // statement still decides alone (a claim's insert-or-read, a completion's
  // fenced update); they only share the commit, which is when each caller
  // learns its answer, as before. In (scope, key) order, so that flights of
  // this process or another lock the rows they share in one order and
  // never deadlock. A flight that fails on the server was rolled back
  // whole: each statement runs again alone, for its own answer; one that
  // lost its connection gives each the error each alone would have got.
  Result<Rows> QueryAlone(std::string_view sql, std::vector<Value> params) override {
    sql_internal::FlightJob job{sql, params};
    flights_.Join(job, options_.pool_size,
                  [this](std::span<sql_internal::FlightJob* const> group) { return Fly(group); });
    if (job.alone) return SqlStore::QueryAlone(sql, std::move(params));
    return std::move(*job.out);
  }

  // Claims are judged by the server's clock unless a clock was given.
  Value ClaimNow() override { return options_.claim_clock ? Value(options_.claim_clock->NowMs()) : Value(); }

  Status InitPartitions() {
    if (!options_.partition_by_day) return Status::OK();
    return EnsurePartitions(env()->NowMs());
  }

  Result<int64_t> Purge(std::string_view consumer, int64_t before_ms, int batch_size) override {
    if (!options_.partition_by_day) return SqlStore::Purge(consumer, before_ms, batch_size);
    if (batch_size < 1) return Status::InvalidArgument("purge batch size must be at least 1");
    IDEM_RETURN_IF_ERROR(EnsurePartitions(env()->NowMs()));
    int64_t dropped = 0;
    // Whole days before the cutoff go with DROP TABLE, when every consumer
    // is purged; for one consumer, rows are deleted instead.
    if (consumer.empty()) {
      IDEM_ASSIGN_OR_RETURN(sql_internal::Lease conn, Take());
      IDEM_ASSIGN_OR_RETURN(Rows parts, conn->Query(pg_internal::kDailyPartitions, {}));
      for (auto& row : parts.rows) {
        std::string name = row[0].AsText();
        if (name.rfind(pg_internal::kDailyPrefix, 0) != 0) continue;
        int64_t day = std::atoll(name.c_str() + std::strlen(pg_internal::kDailyPrefix));
        if ((day + 1) * pg_internal::kDayMs > before_ms) continue;
        IDEM_RETURN_IF_ERROR(conn->Script("BEGIN"));
        auto n = conn->Query("SELECT count(*) FROM " + name, {});
        if (!n.ok()) {  // another purger dropped it first
          (void)conn->Script("ROLLBACK");
          continue;
        }
        if (Status st = conn->Script("DROP TABLE IF EXISTS " + name); !st.ok()) {
          (void)conn->Script("ROLLBACK");
          return st;
        }
        IDEM_RETURN_IF_ERROR(conn->Commit());
        dropped += n->rows[0][0].AsInt();
      }
    }
    IDEM_ASSIGN_OR_RETURN(int64_t deleted, SqlStore::Purge(consumer, before_ms, batch_size));
    return dropped + deleted;
  }

  Result<std::unique_ptr<sql_internal::Connection>> Connect() override {
    IDEM_ASSIGN_OR_RETURN(auto c, Conn::Connect(options_.url, options_.connect_timeout_ms));
    IDEM_ASSIGN_OR_RETURN(const bool pooled, Pooled(*c));
    c->set_pooled(pooled);
    return std::unique_ptr<sql_internal::Connection>(new PgConnection(std::move(c), Gate()));
  }

  // With ack_after = standby_flush, a marker read counts as there only once
  // a standby has it too (an in-doubt commit is settled by this read).
  Result<std::optional<Marker>> FindMarker(std::string_view consumer, std::string_view id,
                                           std::optional<int64_t> produced_at_ms) override {
    IDEM_ASSIGN_OR_RETURN(std::optional<Marker> found, SqlStore::FindMarker(consumer, id, produced_at_ms));
    if (!found.has_value() || options_.ack_after != Options::AckAfter::kStandbyFlush) return found;
    IDEM_RETURN_IF_ERROR(Durable("the marker was found"));
    return found;
  }

  Status Durable(std::string_view what) override {
    if (options_.ack_after != Options::AckAfter::kStandbyFlush) return Status::OK();
    IDEM_ASSIGN_OR_RETURN(sql_internal::Lease conn, Take());
    return static_cast<PgConnection*>(conn.operator->())->AwaitStandby(what);
  }

  AckGate Gate() const {
    return AckGate{options_.ack_after == Options::AckAfter::kStandbyFlush, options_.standby_wait_ms, env()};
  }

  Result<std::vector<std::optional<Fingerprint>>> InsertMarkers(sql_internal::Connection& c,
                                                                std::span<const Marker> markers) override {
    if (options_.partition_by_day) return InsertDaily(c, markers);
    return SqlStore::InsertMarkers(c, markers);
  }

 private:
  static constexpr size_t kMaxGroup = 64;
  static constexpr int64_t kGroupLockWaitMs = 200;

  // One flight of `group`'s statements (see QueryAlone; each statement's
  // params[0] is its scope, params[1] its key): their answers, in
  // the group's order, or none for each when the server rolled the flight
  // back (each then goes alone, on its caller's thread: one that waits for
  // a lock holds up no other).
  std::vector<std::optional<Result<Rows>>> Fly(std::span<sql_internal::FlightJob* const> group) {
    using Answers = std::vector<std::optional<Result<Rows>>>;
    auto lease = Take();
    if (!lease.ok()) return Answers(group.size(), Result<Rows>(lease.status()));
    sql_internal::Connection& c = **lease;
    if (group.size() == 1) return Answers{c.Query(group[0]->sql, group[0]->params)};
    std::vector<size_t> order(group.size());
    std::vector<std::pair<std::string, std::string>> keys;  // (scope, key)
    for (size_t i = 0; i < order.size(); ++i) {
      order[i] = i;
      keys.emplace_back(group[i]->params[0].AsText(), group[i]->params[1].AsText());
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
    // A group waits for no lock long: a row another transaction holds (a
    // claim in a caller's open transaction, whose thread may itself wait for
    // this flight) would hold up every statement of the group. Past the
    // bound the flight fails and each statement goes alone, where a wait
    // holds up only its own caller, as without groups.
    const Value bound[] = {std::to_string(kGroupLockWaitMs) + "ms"};
    std::vector<PgConnection::Statement> statements{{pg_internal::kBoundLockWaits, bound}};
    statements.reserve(order.size() + 1);
    for (size_t i : order) statements.push_back({group[i]->sql, group[i]->params});
    Result<std::vector<Rows>> together = static_cast<PgConnection&>(c).QueryTogether(statements);
    if (!together.ok() && c.Healthy() && !c.InTransaction()) return Answers(group.size());  // rolled back
    Answers out(group.size());
    for (size_t k = 0; k < order.size(); ++k) {
      if (together.ok()) {
        out[order[k]].emplace(std::move((*together)[k + 1]));
      } else {
        out[order[k]].emplace(together.status());  // the connection lost: as each alone would
      }
    }
    return out;
  }

  // Creates the partitions of today and the next days (each in its own
  // transaction). A day whose rows already sit in the default partition
  // keeps them there: creating it then fails, harmlessly.
  Status EnsurePartitions(int64_t now_ms) {
    IDEM_ASSIGN_OR_RETURN(sql_internal::Lease conn, Take());
    const int64_t today = now_ms / pg_internal::kDayMs;
    for (int64_t d = today; d <= today + std::max(0, options_.partition_days_ahead); ++d) {
      std::string sql = "CREATE TABLE IF NOT EXISTS " + std::string(pg_internal::kDailyPrefix) + std::to_string(d) +
                        " PARTITION OF idem_markers_daily FOR VALUES FROM (" + std::to_string(d * pg_internal::kDayMs) +
                        ") TO (" + std::to_string((d + 1) * pg_internal::kDayMs) + ")";
      Status st = conn->Script(sql);
      if (!st.ok() && !conn->Healthy()) return st;
    }
    return Status::OK();
  }

  // The daily layout: lock every key of the batch (in key order), read which
  // exist, insert the rest. The locks are held to the end of the
  // transaction, so a racing consumer's check waits for this one's outcome.
  Result<std::vector<std::optional<Fingerprint>>> InsertDaily(sql_internal::Connection& c,
                                                              std::span<const Marker> markers) {
    std::map<std::string_view, size_t> first;
    std::vector<size_t> unique;
    for (size_t i = 0; i < markers.size(); ++i)
      if (first.emplace(markers[i].id, i).second) unique.push_back(i);
    std::string lock = pg_internal::kDailyLockHead;
    std::vector<Value> keys;
    for (size_t k = 0; k < unique.size(); ++k) {
      lock += (k ? ",($" : "($") + std::to_string(k + 1) + "::bigint)";
      keys.emplace_back(LockKey(markers[unique[k]]));
    }
    lock += pg_internal::kDailyLockTail;
    IDEM_RETURN_IF_ERROR(c.Query(lock, keys).status());

    std::string find = pg_internal::kDailyFindMarkersHead;
    std::vector<Value> fparams{markers.front().consumer};
    for (size_t k = 0; k < unique.size(); ++k) {
      find += (k ? ",$" : "$") + std::to_string(k + 2);
      fparams.emplace_back(IdBlob(markers[unique[k]].id));
    }
    find += ")";
    IDEM_ASSIGN_OR_RETURN(Rows found, c.Query(find, fparams));
    std::map<std::string, Fingerprint> stored;
    for (auto& r : found.rows) stored[r[0].AsText()] = ToFingerprint(r[1]);

    std::string ins = pg_internal::kDailyInsertHead;
    std::vector<Value> params;
    for (size_t i : unique) {
      if (stored.count(markers[i].id)) continue;
      int b = static_cast<int>(params.size());
      ins += (b ? ",($" : "($") + std::to_string(b + 1) + ",$" + std::to_string(b + 2) + ",$" + std::to_string(b + 3) +
             ",$" + std::to_string(b + 4) + ")";
      params.emplace_back(markers[i].consumer);
      params.emplace_back(IdBlob(markers[i].id));
      params.emplace_back(FingerprintBlob(markers[i].fingerprint));
      params.emplace_back(markers[i].processed_at_ms);
    }
    if (!params.empty()) IDEM_RETURN_IF_ERROR(c.Exec(ins, params).status());

    std::vector<std::optional<Fingerprint>> out(markers.size());
    for (size_t i = 0; i < markers.size(); ++i) {
      auto it = stored.find(markers[i].id);
      if (it != stored.end()) {
        out[i] = it->second;
      } else if (size_t f = first[markers[i].id]; f != i) {
        out[i] = markers[f].fingerprint;  // a later copy within the batch
      }
    }
    return out;
  }

  // Whether this store's connections go through a transaction pooler: the
  // option, or (kAuto) what the first connection found; -1 before that.
  Result<bool> Pooled(Conn& c) {
    if (options_.pooler != Options::Pooler::kAuto) {
      const bool said = options_.pooler == Options::Pooler::kTransaction;
      pooled_.store(said ? 1 : 0);
      return said;
    }
    const int known = pooled_.load();
    if (known >= 0) return known == 1;
    IDEM_ASSIGN_OR_RETURN(const bool behind, c.BehindAPooler());
    pooled_.store(behind ? 1 : 0);
    return behind;
  }

  Options options_;
  std::atomic<int> pooled_{-1};
  sql_internal::FlightQueue flights_{kMaxGroup, "postgres.claim_queued"};  // up to pool_size out
};

}  // namespace

namespace {

bool IsPostgresUrl(std::string_view url) {
  const std::string scheme = UrlScheme(url);
  return scheme == "postgres" || scheme == "postgresql";
}

// Takes idem's own keys out of a postgres:// URL's query (libpq would refuse
// them) into `o`'s fields; libpq's keys stay in the URL as written.
Result<Options> TakeIdemKeys(Options o) {
  const size_t q = o.url.find('?');
  if (!IsPostgresUrl(o.url) || q == std::string::npos) return o;
  // The file form: libpq allows what the network form does not (no host,
  // for the Unix socket: postgres:///db?host=/run/postgresql).
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, idem::ParseUrl(o.url, "PostgreSQL URL", UrlForm::kFile));
  std::vector<std::string_view> known = {
      "idem_pool_size", "idem_connect_timeout_ms", "idem_partition_by_day", "idem_create_if_missing",
      "idem_pooler",    "idem_ack_after",          "idem_standby_wait_ms"};
  for (size_t i = 0; i < u.query.size(); ++i) {
    const std::string& k = u.query[i].first;
    if (!k.starts_with("idem_")) continue;
    for (size_t j = 0; j < i; ++j)
      if (u.query[j].first == k)
        return Status::InvalidArgument("'" + k + "' is given twice in '" + RedactUrl(o.url) + "'");
    if (std::find(known.begin(), known.end(), k) == known.end())
      return Status::InvalidArgument("unknown idem option '" + k + "' in the PostgreSQL URL '" + RedactUrl(o.url) +
                                     "' (known: idem_pool_size, idem_connect_timeout_ms, idem_partition_by_day, "
                                     "idem_create_if_missing, idem_pooler, idem_ack_after, idem_standby_wait_ms)");
  }
  IDEM_ASSIGN_OR_RETURN(int64_t pool, u.GetInt("idem_pool_size", o.pool_size, 1, 9999));
  IDEM_ASSIGN_OR_RETURN(o.connect_timeout_ms,
                        u.GetInt("idem_connect_timeout_ms", o.connect_timeout_ms, 1, int64_t{24} * 3600 * 1000));
  IDEM_ASSIGN_OR_RETURN(o.partition_by_day, u.GetBool("idem_partition_by_day", o.partition_by_day));
  IDEM_ASSIGN_OR_RETURN(o.create_if_missing, u.GetBool("idem_create_if_missing", o.create_if_missing));
  IDEM_ASSIGN_OR_RETURN(o.standby_wait_ms, u.GetInt("idem_standby_wait_ms", o.standby_wait_ms, 1, 600'000));
  // A key whose value is one of `names`: its index, or `was` when absent.
  auto choice = [&](const char* key, std::initializer_list<const char*> names, int was) -> Result<int> {
    if (!u.Has(key)) return was;
    const std::string v = u.Get(key);
    std::string list;
    int i = 0;
    for (const char* n : names) {
      if (v == n) return i;
      list += std::string(i == 0 ? "" : i + 1 == static_cast<int>(names.size()) ? " or " : ", ") + n;
      ++i;
    }
    return Status::InvalidArgument(std::string(key) + " must be " + list + ", not '" + v + "' in '" + RedactUrl(o.url) +
                                   "'");
  };
  IDEM_ASSIGN_OR_RETURN(int pooler, choice("idem_pooler", {"auto", "transaction", "none"}, static_cast<int>(o.pooler)));
  o.pooler = static_cast<Options::Pooler>(pooler);
  IDEM_ASSIGN_OR_RETURN(int ack, choice("idem_ack_after", {"commit", "standby_flush"}, static_cast<int>(o.ack_after)));
  o.ack_after = static_cast<Options::AckAfter>(ack);
  o.pool_size = static_cast<int>(pool);
  // The URL as libpq takes it: every pair but idem's, as written.
  std::string kept;
  std::string_view query = std::string_view(o.url).substr(q + 1);
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (kv.empty() || kv.starts_with("idem_")) continue;
    kept += kept.empty() ? "" : "&";
    kept += kv;
  }
  o.url = o.url.substr(0, q) + (kept.empty() ? "" : "?" + kept);
  return o;
}

Status Validate(const Options& o) {
  if (o.pool_size < 1)
    return Status::InvalidArgument("PostgreSQL store: pool_size must be >= 1, not " + std::to_string(o.pool_size));
  if (o.connect_timeout_ms < 1)
    return Status::InvalidArgument("PostgreSQL store: connect_timeout_ms must be > 0, not " +
                                   std::to_string(o.connect_timeout_ms));
  if (o.standby_wait_ms < 1 || o.standby_wait_ms > 600'000)
    return Status::InvalidArgument("PostgreSQL store: standby_wait_ms must be from 1 to 600000, not " +
                                   std::to_string(o.standby_wait_ms));
  if (o.partition_days_ahead < 0 || o.partition_days_ahead > 366)
    return Status::InvalidArgument("PostgreSQL store: partition_days_ahead must be from 0 to 366, not " +
                                   std::to_string(o.partition_days_ahead));
  return Status::OK();
}

}  // namespace

Result<Options> Store::ParseUrl(std::string_view url) {
  if (!IsPostgresUrl(url))
    return Status::InvalidArgument("not a PostgreSQL URL: '" + RedactUrl(url) + "' (expected postgres://...)");
  Options o;
  o.url = std::string(url);
  return TakeIdemKeys(std::move(o));
}

Result<std::unique_ptr<idem::Store>> Store::Open(const Options& given) {
  IDEM_ASSIGN_OR_RETURN(Options options, TakeIdemKeys(given));
  IDEM_RETURN_IF_ERROR(Validate(options));
  auto store = std::make_unique<PgStore>(options);
  std::string name = options.url.empty() ? "PostgreSQL (PG* environment)" : "PostgreSQL";
  IDEM_RETURN_IF_ERROR(store->Init(options.create_if_missing, name));
  IDEM_RETURN_IF_ERROR(store->InitPartitions().WithContext(name + ": daily partitions"));
  return std::unique_ptr<idem::Store>(std::move(store));
}

}  // namespace idem::postgres
