// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "sql/sql_store.h"

#include "sql/sql_outbox.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "core/kill_point.h"

namespace idem::sql_internal {

Blob IdBlob(std::string_view id) { return Blob{std::string(id)}; }
Blob FingerprintBlob(const Fingerprint& fp) {
  return Blob{std::string(reinterpret_cast<const char*>(fp.data()), fp.size())};
}
Fingerprint ToFingerprint(const Value& v) {
  Fingerprint fp{};
  std::string bytes = v.AsText();
  std::memcpy(fp.data(), bytes.data(), std::min(bytes.size(), fp.size()));
  return fp;
}

Lease::~Lease() {
  if (conn_ && store_) store_->Return(std::move(conn_));
}

// ------------------------------------------------------------ SqlTransaction

Status SqlTransaction::Usable() const {
  return done_ ? Status::Internal("transaction already committed or rolled back") : Status::OK();
}

namespace {
// Up to three words of `sql` from its start, past whitespace and comments,
// as views into it (no copies: this runs before every statement of a
// handler).
struct LeadingWords {
  std::string_view word[3];
  size_t count = 0;
  explicit LeadingWords(std::string_view sql) {
    size_t i = 0;
    while (i < sql.size() && count < 3) {
      const char c = sql[i];
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++i;
      } else if (sql.substr(i, 2) == "--") {
        i = sql.find('\n', i);
        if (i == std::string_view::npos) break;
      } else if (sql.substr(i, 2) == "/*") {
        i = sql.find("*/", i + 2);
        if (i == std::string_view::npos) break;
        i += 2;
      } else if (std::isalpha(static_cast<unsigned char>(c))) {
        const size_t start = i;
        while (i < sql.size() && std::isalpha(static_cast<unsigned char>(sql[i]))) ++i;
        word[count++] = sql.substr(start, i - start);
      } else {
        break;
      }
    }
  }
  // Whether word k is `upper` (given in upper case), in any case.
  bool Is(size_t k, std::string_view upper) const {
    return k < count && word[k].size() == upper.size() &&
           std::equal(upper.begin(), upper.end(), word[k].begin(),
                      [](char u, char c) { return u == std::toupper(static_cast<unsigned char>(c)); });
  }
};
}  // namespace

// A statement that would end (or nest) the transaction idem runs the work
// in: the marker and the effect would no longer commit together. Savepoints
// (SAVEPOINT, RELEASE, ROLLBACK TO) stay inside it and are allowed.
bool EndsOrStartsATransaction(std::string_view sql) {
  const LeadingWords w(sql);
  if (w.Is(0, "BEGIN") || w.Is(0, "COMMIT") || w.Is(0, "END") || w.Is(0, "ABORT")) return true;
  if (w.Is(0, "ROLLBACK")) {
    // ROLLBACK [TRANSACTION|WORK] TO [SAVEPOINT] name stays inside.
    const size_t k = w.Is(1, "TRANSACTION") || w.Is(1, "WORK") ? 2 : 1;
    return !w.Is(k, "TO");
  }
  return (w.Is(0, "START") || w.Is(0, "PREPARE")) && w.Is(1, "TRANSACTION");
}

namespace {
// Whether the outbox rows queued so far must be written before `sql` runs:
// before a savepoint is set or rolled back to (so that it takes exactly the
// Adds made after it), and before a statement that reads the outbox. Every
// other statement lets them wait for COMMIT, where they go in one insert.
bool NeedsOutboxWritten(std::string_view sql) {
  const LeadingWords w(sql);
  return w.Is(0, "SAVEPOINT") || w.Is(0, "ROLLBACK") || sql.find("idem_outbox") != std::string_view::npos;
}

Status NotInsideIdemsTransaction(std::string_view sql) {
  if (!EndsOrStartsATransaction(sql)) return Status::OK();
  std::string m = "'";
  m.append(sql.substr(0, 40));
  m += "': work runs inside idem's transaction, which idem begins and commits with the marker (savepoints are fine)";
  return Status::InvalidArgument(m);
}
}  // namespace

Result<std::string> MultiRowInsert(std::string_view insert, size_t width, size_t rows) {
  auto refuse = [&](std::string_view why) {
    return Status::InvalidArgument("InsertLater: " + std::string(why) + ": '" + std::string(insert.substr(0, 80)) +
                                   "'");
  };
  std::string lower(insert);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (!LeadingWords(insert).Is(0, "INSERT")) return refuse("not an INSERT");
  if (lower.find("returning") != std::string::npos) return refuse("RETURNING: nobody reads a later insert's answer");
  const size_t values = lower.find("values");
  const size_t open = values == std::string::npos ? values : insert.find('(', values);
  if (open == std::string_view::npos) return refuse("no VALUES tuple");
  // The tuple: to its matching ')', outside quoted text.
  size_t close = std::string_view::npos;
  int depth = 0;
  bool quoted = false;
  for (size_t i = open; i < insert.size() && close == std::string_view::npos; ++i) {
    const char c = insert[i];
    if (c == '\'') quoted = !quoted;
    if (quoted) continue;
    if (c == '(') ++depth;
    if (c == ')' && --depth == 0) close = i;
  }
  if (close == std::string_view::npos) return refuse("the VALUES tuple is not closed");
  const std::string_view tuple = insert.substr(open, close - open + 1);
  // The tuple as pieces of text between its $N parameters.
  std::vector<std::string_view> text;
  std::vector<size_t> param;
  size_t from = 0;
  quoted = false;
  for (size_t i = 0; i < tuple.size(); ++i) {
    if (tuple[i] == '\'') quoted = !quoted;
    if (quoted || tuple[i] != '$' || i + 1 >= tuple.size() || !std::isdigit(static_cast<unsigned char>(tuple[i + 1])))
      continue;
    size_t j = i + 1, n = 0;
    while (j < tuple.size() && std::isdigit(static_cast<unsigned char>(tuple[j]))) n = n * 10 + (tuple[j++] - '0');
    if (n < 1 || n > width) return refuse("a parameter of the tuple is not $1..$" + std::to_string(width));
    text.push_back(tuple.substr(from, i - from));
    param.push_back(n);
    from = j;
    i = j - 1;
  }
  text.push_back(tuple.substr(from));
  std::string out(insert.substr(0, open));
  for (size_t r = 0; r < rows; ++r) {
    if (r > 0) out += ", ";
    for (size_t k = 0; k < param.size(); ++k) {
      out += text[k];
      out += '$';
      out += std::to_string(r * width + param[k]);
    }
    out += text.back();
  }
  out += insert.substr(close + 1);
  return out;
}

Status SqlTransaction::InsertLater(std::string_view insert, std::span<const Value> row) {
  IDEM_RETURN_IF_ERROR(Usable());
  if (row.empty()) return Status::InvalidArgument("InsertLater: a row without values");
  auto it = std::find_if(later_.begin(), later_.end(), [&](const Later& l) { return l.insert == insert; });
  if (it == later_.end()) {
    IDEM_RETURN_IF_ERROR(MultiRowInsert(insert, row.size(), 1).status());  // refused now, not at the flush
    later_.push_back(Later{std::string(insert), row.size(), {}});
    it = later_.end() - 1;
  } else if (it->width != row.size()) {
    return Status::InvalidArgument("InsertLater: a row of " + std::to_string(row.size()) +
                                   " values for a statement of " + std::to_string(it->width));
  }
  it->values.insert(it->values.end(), row.begin(), row.end());
  return Status::OK();
}

Status SqlTransaction::Ready(bool now) {
  IDEM_RETURN_IF_ERROR(Usable());
  if (later_.empty()) return now ? conn_->SendDeferred() : Status::OK();
  std::vector<Later> later = std::move(later_);
  later_.clear();
  // A statement takes at most 32,766 parameters (SQLite's bound; PostgreSQL's
  // is 65,535): larger queues go in several.
  constexpr size_t kMaxParams = 32'766;
  for (const Later& l : later) {
    const size_t per = std::max<size_t>(1, kMaxParams / l.width);
    const size_t rows = l.values.size() / l.width;
    for (size_t first = 0; first < rows; first += per) {
      const size_t n = std::min(per, rows - first);
      IDEM_ASSIGN_OR_RETURN(std::string sql, MultiRowInsert(l.insert, l.width, n));
      const auto rows_of = std::span<const Value>(l.values).subspan(first * l.width, n * l.width);
      // Unless asked to send them now, the rows ride with the next statement.
      if (!now && conn_->Defer(sql, rows_of)) continue;
      IDEM_RETURN_IF_ERROR(conn_->Exec(sql, rows_of).status());
    }
  }
  // Now means now: rows held back for a statement that never went (refused,
  // or an empty batch) go too.
  return now ? conn_->SendDeferred() : Status::OK();
}

Status SqlTransaction::BoundLockWaits(int64_t ms) {
  IDEM_RETURN_IF_ERROR(Usable());
  if (ms <= 0) return Status::InvalidArgument("BoundLockWaits: the bound must be > 0 ms, got " + std::to_string(ms));
  const char* sql = store_.dialect().bound_lock_waits;
  if (sql == nullptr) return Status::OK();
  const Value bound[] = {std::to_string(ms) + "ms"};
  // Rides with the next statement where the connection can hold it back.
  if (conn_->Defer(sql, bound)) return Status::OK();
  return conn_->Exec(sql, bound).status();
}

Result<int64_t> SqlTransaction::Exec(std::string_view sql, std::span<const Value> params) {
  IDEM_RETURN_IF_ERROR(Ready());
  IDEM_RETURN_IF_ERROR(NotInsideIdemsTransaction(sql));
  if (!outbox_rows_.empty() && NeedsOutboxWritten(sql)) IDEM_RETURN_IF_ERROR(FlushOutbox());
  return conn_->Exec(sql, params);
}

Result<std::vector<Rows>> Connection::QueryMany(std::string_view sql, std::span<const std::vector<Value>> each) {
  std::vector<Rows> out;
  out.reserve(each.size());
  for (const auto& params : each) {
    IDEM_ASSIGN_OR_RETURN(Rows r, Query(sql, params));
    out.push_back(std::move(r));
  }
  return out;
}

Result<Rows> SqlTransaction::Query(std::string_view sql, std::span<const Value> params) {
  IDEM_RETURN_IF_ERROR(Ready());
  IDEM_RETURN_IF_ERROR(NotInsideIdemsTransaction(sql));
  if (!outbox_rows_.empty() && NeedsOutboxWritten(sql)) IDEM_RETURN_IF_ERROR(FlushOutbox());
  return conn_->Query(sql, params);
}

Result<std::optional<Fingerprint>> SqlTransaction::InsertMarker(const Marker& m) {
  IDEM_ASSIGN_OR_RETURN(auto r, InsertMarkers(std::span<const Marker>(&m, 1)));
  return r.front();
}

Result<std::vector<std::optional<Fingerprint>>> SqlTransaction::InsertMarkers(std::span<const Marker> markers) {
  IDEM_RETURN_IF_ERROR(Ready());
  return store_.InsertMarkers(*conn_, markers);
}

Status SqlTransaction::PutDeadLetter(const DeadLetter& d) {
  IDEM_RETURN_IF_ERROR(Ready());
  Value p[] = {d.consumer, IdBlob(d.id), d.reason, d.error, d.attempts, Blob{d.payload}, d.at_ms};
  return conn_->Exec(kPutDeadLetter, p).status();
}

Result<ClaimOutcome> SqlTransaction::ClaimInTransaction(const ClaimRequest& request) {
  IDEM_RETURN_IF_ERROR(Ready());
  return store_.ClaimOn(&*conn_, request);
}

Status SqlTransaction::CompleteInTransaction(const ClaimToken& token, std::string_view result, bool is_error,
                                             int64_t retention_ms) {
  IDEM_RETURN_IF_ERROR(Ready());
  return store_.CompleteOn(&*conn_, token, result, is_error, retention_ms);
}

std::vector<Result<ClaimOutcome>> SqlTransaction::ClaimManyInTransaction(std::span<const ClaimRequest> requests) {
  if (Status s = Ready(); !s.ok()) return std::vector<Result<ClaimOutcome>>(requests.size(), s);
  return store_.ClaimManyOn(*conn_, requests);
}

std::vector<Status> SqlTransaction::CompleteManyInTransaction(std::span<const Completion> completions,
                                                              int64_t retention_ms) {
  if (Status s = Ready(); !s.ok()) return std::vector<Status>(completions.size(), s);
  return store_.CompleteManyOn(*conn_, completions, retention_ms);
}

OutboxStore* SqlTransaction::outbox() { return store_.outbox_store(); }

Status SqlTransaction::AddToOutbox(std::vector<OutboxRow> rows) {
  IDEM_RETURN_IF_ERROR(Usable());
  if (store_.outbox_store() == nullptr) return StoreTransaction::AddToOutbox(std::move(rows));
  for (auto& r : rows) outbox_rows_.push_back(std::move(r));
  return Status::OK();
}

Status SqlTransaction::FlushOutbox() {
  if (outbox_rows_.empty()) return Status::OK();
  std::vector<OutboxRow> rows = std::move(outbox_rows_);
  outbox_rows_.clear();
  IDEM_RETURN_IF_ERROR(store_.WriteOutbox(*conn_, rows));
  outbox_written_ = true;
  return Status::OK();
}

Status SqlTransaction::Commit() {
  IDEM_RETURN_IF_ERROR(Usable());
  if (Status f = Ready(); !f.ok()) {  // a later insert failed: nothing commits
    Rollback();
    return f;
  }
  if (Status f = FlushOutbox(); !f.ok()) {
    Rollback();
    return f;
  }
  Status s = conn_->Commit();
  if (s.ok()) store_.Committed(conn_.get());
  if (s.ok() && outbox_written_) store_.OutboxCommitted();
  if (s.ok() || s.code() == Code::kInDoubt || !conn_->InTransaction()) {
    done_ = true;
    return s;
  }
  Rollback();
  return s;
}

void SqlTransaction::Rollback() noexcept {
  later_.clear();
  if (done_) return;
  done_ = true;
  if (conn_->Healthy() && conn_->InTransaction()) (void)conn_->Script("ROLLBACK");
}

// ------------------------------------------------------------------ SqlStore

SqlStore::SqlStore(const Dialect& dialect, Env* env, int pool_size)
    : dialect_(dialect), env_(env ? env : Env::Default()), pool_size_(static_cast<size_t>(std::max(1, pool_size))) {
  if (dialect_.outbox != nullptr) outbox_ = std::make_unique<SqlOutbox>(*this);
}
SqlStore::~SqlStore() = default;

void SqlStore::Return(std::unique_ptr<Connection> conn) {
  // Never reuse a connection that is broken or in an unknown state.
  if (!conn->Healthy() || conn->InTransaction()) return;
  std::lock_guard<std::mutex> l(mu_);
  if (conn.get() == last_committed_) {
    std::swap(conn, warm_);
    if (conn == nullptr) return;
  }
  if (pool_.size() < pool_size_) pool_.push_back(std::move(conn));
}

void SqlStore::Committed(const Connection* conn) {
  std::lock_guard<std::mutex> l(mu_);
  last_committed_ = conn;
}

void SqlStore::ClosePool() {
  std::lock_guard<std::mutex> l(mu_);
  pool_.clear();
  warm_.reset();
}

Result<Lease> SqlStore::Take(bool for_write) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (for_write && warm_ != nullptr && warm_->Healthy()) return Lease(this, std::move(warm_));
    while (!pool_.empty()) {
      auto c = std::move(pool_.back());
      pool_.pop_back();
      if (c->Healthy()) return Lease(this, std::move(c));
    }
  }
  IDEM_ASSIGN_OR_RETURN(auto c, Connect());
  return Lease(this, std::move(c));
}

Result<std::unique_ptr<StoreTransaction>> SqlStore::Begin() { return Start(/*defer=*/false); }
Result<std::unique_ptr<StoreTransaction>> SqlStore::BeginDeferred() { return Start(/*defer=*/true); }

Status SqlStore::OnPooled(const std::function<Status(Lease&)>& op, bool for_write) {
  // A pooled connection may have died since its last use (a server restart,
  // a connection cut after its last answer): `op` then fails with the
  // connection found broken and nothing done, so one more try on a new one.
  // The other pooled connections date from before the same restart: they
  // are dropped too, and the retry connects afresh.
  IDEM_ASSIGN_OR_RETURN(Lease conn, Take(for_write));
  Status s = op(conn);
  if (s.ok() || conn->Healthy()) return s;
  ClosePool();
  IDEM_ASSIGN_OR_RETURN(auto fresh, Connect());
  Lease again(this, std::move(fresh));
  return op(again);
}

Result<std::unique_ptr<StoreTransaction>> SqlStore::Start(bool defer) {
  // (A held-back BEGIN is retried the same way, by the connection, with its
  // first statement.)
  std::unique_ptr<StoreTransaction> tx;
  IDEM_RETURN_IF_ERROR(OnPooled(
      [&](Lease& conn) {
        IDEM_RETURN_IF_ERROR(defer && conn->DeferBegin(dialect_.begin) ? Status::OK() : conn->Script(dialect_.begin));
        tx.reset(new SqlTransaction(*this, std::move(conn)));
        return Status::OK();
      },
      /*for_write=*/true));
  return tx;
}

Result<std::vector<std::optional<Fingerprint>>> SqlStore::InsertMarkers(Connection& c,
                                                                        std::span<const Marker> markers) {
  if (markers.size() > 1 && dialect_.insert_markers_head != nullptr) return InsertMarkersMultiRow(c, markers);
  std::vector<std::optional<Fingerprint>> out;
  out.reserve(markers.size());
  for (const Marker& m : markers) {
    Value ins[] = {m.consumer, IdBlob(m.id), FingerprintBlob(m.fingerprint), m.processed_at_ms};
    IDEM_ASSIGN_OR_RETURN(int64_t changed, c.Exec(dialect_.insert_marker, ins));
    if (changed == 1) {
      out.emplace_back();
      continue;
    }
    Value key[] = {m.consumer, IdBlob(m.id)};
    IDEM_ASSIGN_OR_RETURN(Rows rows, c.Query(dialect_.find_marker, key));
    if (rows.rows.empty()) return Status::Internal("marker insert was ignored but no marker exists");
    out.emplace_back(ToFingerprint(rows.rows[0][0]));
  }
  return out;
}

// A batch's markers (one consumer) in two statements per chunk: one
// multi-row INSERT ... ON CONFLICT DO NOTHING RETURNING id, then one SELECT
// for the ids that already existed. Within the batch only the first copy of
// an id is inserted; later copies answer with its fingerprint.
Result<std::vector<std::optional<Fingerprint>>> SqlStore::InsertMarkersMultiRow(Connection& c,
                                                                                std::span<const Marker> markers) {
  constexpr size_t kChunk = 1000;            // 4 parameters each: under every server's limit
  std::map<std::string_view, size_t> first;  // id -> index of its first copy
  std::vector<size_t> unique;
  for (size_t i = 0; i < markers.size(); ++i)
    if (first.emplace(markers[i].id, i).second) unique.push_back(i);
  std::set<std::string> inserted;
  std::map<std::string, Fingerprint> stored;  // ids that existed before this batch
  for (size_t from = 0; from < unique.size(); from += kChunk) {
    const size_t to = std::min(unique.size(), from + kChunk);
    std::string sql = dialect_.insert_markers_head;
    std::vector<Value> params;
    params.reserve((to - from) * 4);
    for (size_t k = from; k < to; ++k) {
      const Marker& m = markers[unique[k]];
      const size_t b = (k - from) * 4;
      sql += (k > from ? ",($" : "($") + std::to_string(b + 1) + ",$" + std::to_string(b + 2) + ",$" +
             std::to_string(b + 3) + ",$" + std::to_string(b + 4) + ")";
      params.emplace_back(m.consumer);
      params.emplace_back(IdBlob(m.id));
      params.emplace_back(FingerprintBlob(m.fingerprint));
      params.emplace_back(m.processed_at_ms);
    }
    sql += dialect_.insert_markers_tail;
    IDEM_ASSIGN_OR_RETURN(Rows rows, c.Query(sql, params));
    for (auto& r : rows.rows) inserted.insert(r[0].AsText());
    std::string find = dialect_.find_markers_head;
    std::vector<Value> fparams{markers.front().consumer};
    for (size_t k = from; k < to; ++k) {
      const std::string& id = markers[unique[k]].id;
      if (inserted.count(id)) continue;
      find += (fparams.size() > 1 ? ",$" : "$") + std::to_string(fparams.size() + 1);
      fparams.emplace_back(IdBlob(id));
    }
    if (fparams.size() > 1) {
      find += ")";
      IDEM_ASSIGN_OR_RETURN(Rows found, c.Query(find, fparams));
      for (auto& r : found.rows) stored[r[0].AsText()] = ToFingerprint(r[1]);
    }
  }
  std::vector<std::optional<Fingerprint>> out(markers.size());
  for (size_t i = 0; i < markers.size(); ++i) {
    const std::string& id = markers[i].id;
    if (inserted.count(id)) {
      if (size_t f = first[id]; f != i) out[i] = markers[f].fingerprint;  // a later copy within the batch
      continue;
    }
    auto it = stored.find(id);
    if (it == stored.end()) {
      // Not inserted, yet not visible: a concurrent transaction committed it
      // after the statement's snapshot (PostgreSQL). A new statement sees it.
      Value key[] = {markers[i].consumer, IdBlob(id)};
      IDEM_ASSIGN_OR_RETURN(Rows one, c.Query(dialect_.find_marker, key));
      if (one.rows.empty()) return Status::Internal("marker insert was ignored but no marker exists");
      it = stored.emplace(id, ToFingerprint(one.rows[0][0])).first;
    }
    out[i] = it->second;
  }
  return out;
}

Result<Rows> SqlStore::Read(std::string_view sql, std::span<const Value> params) {
  Rows rows;
  IDEM_RETURN_IF_ERROR(OnPooled([&](Lease& conn) -> Status {
    IDEM_ASSIGN_OR_RETURN(rows, conn->Query(sql, params));
    return Status::OK();
  }));
  return rows;
}

Result<std::optional<Marker>> SqlStore::FindMarker(std::string_view consumer, std::string_view id,
                                                   std::optional<int64_t>) {
  Value key[] = {std::string(consumer), IdBlob(id)};
  IDEM_ASSIGN_OR_RETURN(Rows rows, Read(dialect_.find_marker, key));
  if (rows.rows.empty()) return std::optional<Marker>();
  return std::optional<Marker>(
      Marker{std::string(consumer), std::string(id), ToFingerprint(rows.rows[0][0]), rows.rows[0][1].AsInt()});
}

Result<FailureCount> SqlStore::RecordFailure(const FailureRecord& f) {
  using Kind = FailureRecord::Kind;
  IDEM_ASSIGN_OR_RETURN(auto tx, Begin());
  FailureCount count;
  Value key[] = {f.consumer, IdBlob(f.message->id)};
  IDEM_ASSIGN_OR_RETURN(bool applied, HasMarker(static_cast<SqlTransaction&>(*tx).conn(), f.consumer, f.message->id,
                                                f.message->producer_time_ms));
  if (applied) {
    IDEM_RETURN_IF_ERROR(tx->Exec(kClearFailure, key).status());
    IDEM_RETURN_IF_ERROR(tx->Commit());
    count.already_applied = true;
    return count;
  }
  const auto dead_letter = [&](const char* reason) -> Status {
    count.dead_lettered = true;
    return tx->PutDeadLetter(
        DeadLetter{f.consumer, f.message->id, reason, f.error, count.attempts, f.message->payload, f.now_ms});
  };
  Value p[] = {f.consumer, IdBlob(f.message->id), f.error, f.now_ms};
  if (f.kind == Kind::kCrashLoop) {
    // In progress: not a crash loop (its deliveries reached an outcome).
    IDEM_ASSIGN_OR_RETURN(Rows found, tx->Query(kFindFailure, key));
    if (!found.rows.empty() && !found.rows[0][1].is_null()) {
      count.attempts = static_cast<int>(found.rows[0][0].AsInt());
      count.in_progress = true;
      IDEM_RETURN_IF_ERROR(tx->Commit());
      return count;
    }
  }
  // attempts, in_progress_since_ms, parked_at_ms: the row after this call.
  IDEM_ASSIGN_OR_RETURN(Rows rows, tx->Query(f.kind == Kind::kInProgress ? kNoteInProgress : kBumpFailure, p));
  std::optional<int64_t> since, parked_at;
  count.attempts = 1;
  if (!rows.rows.empty()) {
    count.attempts = static_cast<int>(rows.rows[0][0].AsInt());
    if (!rows.rows[0][1].is_null()) since = rows.rows[0][1].AsInt();
    if (!rows.rows[0][2].is_null()) parked_at = rows.rows[0][2].AsInt();
  }
  count.in_progress = since.has_value();
  if (f.kind == Kind::kRejected) {
    IDEM_RETURN_IF_ERROR(dead_letter("rejected"));
  } else if (count.in_progress) {
    // A step may have taken effect: never dead-lettered as a failure. Parked
    // (once) when it has been unfinished for long.
    if (!parked_at && f.park_after_ms > 0 && f.now_ms - *since >= f.park_after_ms) {
      Value park[] = {f.consumer, IdBlob(f.message->id), f.now_ms};
      IDEM_RETURN_IF_ERROR(tx->Exec(kMarkParked, park).status());
      IDEM_RETURN_IF_ERROR(tx->PutDeadLetter(DeadLetter{
          f.consumer, f.message->id, "parked", "in progress since " + std::to_string(*since) + " ms: " + f.error,
          count.attempts, f.message->payload, f.now_ms}));
      count.parked = true;
    }
  } else if (f.kind == Kind::kCrashLoop) {
    IDEM_RETURN_IF_ERROR(dead_letter("failed"));
  } else if (f.kind == Kind::kFailed && f.max_attempts > 0 && count.attempts >= f.max_attempts) {
    IDEM_RETURN_IF_ERROR(dead_letter("failed"));
  }
  IDEM_RETURN_IF_ERROR(tx->Commit());
  return count;
}

Result<bool> SqlStore::HasMarker(Connection& c, const std::string& consumer, std::string_view id,
                                 std::optional<int64_t>) {
  Value key[] = {consumer, IdBlob(id)};
  IDEM_ASSIGN_OR_RETURN(Rows rows, c.Query(dialect_.find_marker, key));
  return !rows.rows.empty();
}

Status SqlStore::ClearFailures(std::string_view consumer, std::string_view id) {
  // Kafka's deliveries carry no count, so this runs on each of its acks: one
  // statement when there is nothing to clear.
  IDEM_ASSIGN_OR_RETURN(Lease conn, Take());
  Value p[] = {std::string(consumer), IdBlob(id)};
  IDEM_ASSIGN_OR_RETURN(int64_t cleared, conn->Exec(kClearFailure, p));
  if (cleared == 0) return Status::OK();
  return conn->Exec(kClearParked, p).status();
}

Result<int64_t> SqlStore::Purge(std::string_view consumer, int64_t before_ms, int batch_size) {
  if (batch_size < 1) return Status::InvalidArgument("purge batch size must be at least 1");
  int64_t total = 0;
  for (;;) {
    IDEM_ASSIGN_OR_RETURN(auto tx, Begin());
    Value p[] = {before_ms, std::string(consumer), int64_t{batch_size}};
    IDEM_ASSIGN_OR_RETURN(int64_t n, tx->Exec(dialect_.purge_markers, p));
    IDEM_RETURN_IF_ERROR(tx->Commit());
    total += n;
    if (n < batch_size) return total;
    // A purge paused here resumes with its cut, not a newer one: each batch
    // checks the cut again on the rows it deletes.
    IDEM_KILL_POINT("store.purge_batch");
  }
}

Result<int64_t> SqlStore::CountMarkers(std::string_view consumer) {
  Value p[] = {std::string(consumer)};
  IDEM_ASSIGN_OR_RETURN(Rows rows, Read(dialect_.count_markers, p));
  return rows.rows[0][0].AsInt();
}

Status CheckListLimit(int limit) {
  // SQL takes LIMIT -1 as "no limit": a negative limit must not list everything.
  if (limit < 0) return Status::InvalidArgument("a list limit cannot be negative, got " + std::to_string(limit));
  return Status::OK();
}

Result<std::vector<Marker>> SqlStore::ListMarkers(std::string_view consumer, int limit) {
  IDEM_RETURN_IF_ERROR(CheckListLimit(limit));
  Value p[] = {std::string(consumer), int64_t{limit}};
  IDEM_ASSIGN_OR_RETURN(Rows rows, Read(dialect_.list_markers, p));
  std::vector<Marker> out;
  for (auto& r : rows.rows) out.push_back(Marker{r[0].AsText(), r[1].AsText(), ToFingerprint(r[2]), r[3].AsInt()});
  return out;
}

Result<std::vector<DeadLetter>> SqlStore::ListDeadLetters(std::string_view consumer, int limit) {
  IDEM_RETURN_IF_ERROR(CheckListLimit(limit));
  Value p[] = {std::string(consumer), int64_t{limit}};
  IDEM_ASSIGN_OR_RETURN(Rows rows, Read(kListDeadLetters, p));
  std::vector<DeadLetter> out;
  for (auto& r : rows.rows)
    out.push_back(DeadLetter{r[0].AsText(), r[1].AsText(), r[2].AsText(), r[3].AsText(), static_cast<int>(r[4].AsInt()),
                             r[5].AsText(), r[6].AsInt()});
  return out;
}

Result<Store::SchemaInfo> SqlStore::Schema() {
  IDEM_ASSIGN_OR_RETURN(Lease conn, Take());
  IDEM_ASSIGN_OR_RETURN(Rows v, conn->Query("SELECT coalesce(max(version), 0) FROM idem_migrations", {}));
  SchemaInfo info;
  info.version = static_cast<int>(v.rows[0][0].AsInt());
  info.statements.push_back(dialect_.create_migrations);
  for (const Migration& m : dialect_.migrations) {
    if (m.version > info.version) break;
    std::string_view sql = m.sql;
    while (!sql.empty()) {
      auto semi = sql.find(';');
      std::string_view stmt = sql.substr(0, semi);
      if (!stmt.empty()) info.statements.emplace_back(stmt);
      if (semi == std::string_view::npos) break;
      sql.remove_prefix(semi + 1);
    }
  }
  return info;
}

Status SqlStore::Init(bool create_if_missing, const std::string& name) {
  IDEM_ASSIGN_OR_RETURN(Lease conn, Take());
  Connection& c = *conn;
  const int known = dialect_.migrations.empty() ? 0 : dialect_.migrations.back().version;
  // A store already at this build's version needs no write: it opens
  // without the write lock, so a reader (`idem inspect`) never waits for a
  // busy writer. A missing table is the only failure that means "no schema
  // yet"; any other (a corrupt file, a lost server) is reported as itself.
  if (auto v = c.Query("SELECT coalesce(max(version), 0) FROM idem_migrations", {}); v.ok()) {
    const int version = static_cast<int>(v->rows[0][0].AsInt());
    if (version == known) return Status::OK();
  } else if (v.status().code() != Code::kInvalidArgument) {
    return v.status().WithContext(name);
  }
  IDEM_RETURN_IF_ERROR(c.Script(dialect_.begin).WithContext("migrate " + name));
  auto fail = [&](const Status& s) {
    if (c.Healthy() && c.InTransaction()) (void)c.Script("ROLLBACK");
    return s.WithContext(name);
  };
  if (*dialect_.migration_lock != '\0') {
    if (auto r = c.Query(dialect_.migration_lock, {}); !r.ok()) return fail(r.status());
  }
  auto has = c.Query("SELECT count(*) FROM idem_migrations", {});
  if (!has.ok() && has.status().code() != Code::kInvalidArgument) return fail(has.status());
  if (!has.ok()) {
    // No migrations table. On PostgreSQL the failed SELECT aborted the
    // transaction, so start over before creating it.
    if (!create_if_missing)
      return fail(Status::SchemaMismatch("no idem schema here (and creating it is switched off)"));
    (void)c.Script("ROLLBACK");
    IDEM_RETURN_IF_ERROR(c.Script(dialect_.begin).WithContext("migrate " + name));
    if (*dialect_.migration_lock != '\0') {
      if (auto r = c.Query(dialect_.migration_lock, {}); !r.ok()) return fail(r.status());
    }
  }
  if (Status s = c.Script(dialect_.create_migrations); !s.ok()) return fail(s);
  auto v = c.Query("SELECT coalesce(max(version), 0) FROM idem_migrations", {});
  if (!v.ok()) return fail(v.status());
  int version = static_cast<int>(v->rows[0][0].AsInt());
  if (version > known)
    return fail(Status::SchemaMismatch("idem schema version " + std::to_string(version) +
                                       " is newer than this build understands (" + std::to_string(known) +
                                       "): upgrade idem"));
  for (const Migration& m : dialect_.migrations) {
    if (m.version <= version) continue;
    if (Status s = c.Script(m.sql); !s.ok()) return fail(s.WithContext("migration " + std::to_string(m.version)));
    Value p[] = {m.version, m.description, env_->NowMs()};
    auto r = c.Exec("INSERT INTO idem_migrations(version, description, applied_at_ms) VALUES ($1, $2, $3)", p);
    if (!r.ok()) return fail(r.status());
  }
  return c.Commit().WithContext("migrate " + name);
}

}  // namespace idem::sql_internal
