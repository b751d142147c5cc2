// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "sql/sql_outbox.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/header_codec.h"
#include "core/kill_point.h"

namespace idem::sql_internal {

uint64_t OutboxKeyHash(std::string_view key_or_id) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : key_or_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

// The same SQL on every backend (off the hot path, no layout to tune).
constexpr const char* kNoteFailure = "UPDATE idem_outbox SET attempts = attempts + 1, last_error = $2 WHERE seq = $1";
constexpr const char* kForgetRelay = "DELETE FROM idem_outbox_relays WHERE name = $1";
constexpr const char* kListDead =
    "SELECT seq, id, destination, ordering_key, payload, headers, producer_time_ms, added_at_ms, attempts, reason,"
    " error, at_ms FROM idem_outbox_dead ORDER BY at_ms DESC, seq DESC LIMIT $1";
constexpr const char* kPurgeSent =
    "DELETE FROM idem_outbox_sent WHERE seq IN (SELECT seq FROM idem_outbox_sent WHERE sent_at_ms < $1"
    " ORDER BY seq LIMIT $2)";
constexpr const char* kPurgeDead =
    "DELETE FROM idem_outbox_dead WHERE seq IN (SELECT seq FROM idem_outbox_dead WHERE at_ms < $1 ORDER BY seq"
    " LIMIT $2)";

constexpr size_t kRowsPerInsert = 1000;  // 8 parameters each: far below the servers' limits
constexpr int64_t kLiveMs = 5'000;       // a relay not seen for this long no longer counts

template <typename T>
std::string List(char open, const T& items) {
  std::string s(1, open);
  bool first = true;
  for (const auto& v : items) {
    if (!first) s += ',';
    first = false;
    s += std::to_string(v);
  }
  s += open == '{' ? '}' : ']';
  return s;
}

std::string_view KeyOrId(const OutboxRow& r) {
  return r.key.empty() ? std::string_view(r.id) : std::string_view(r.key);
}

Result<OutboxRow> RowFrom(const std::vector<Value>& v) {
  OutboxRow r;
  r.seq = v[0].AsInt();
  r.id = v[1].AsText();
  r.destination = v[2].AsText();
  r.key = v[3].AsText();
  r.payload = v[4].AsText();
  auto headers = internal::DecodeHeaders(v[5].AsText());
  if (!headers.has_value())
    return Status::Corruption("outbox row " + std::to_string(r.seq) + ": its headers are not in idem's encoding");
  r.headers = std::move(*headers);
  r.producer_time_ms = v[6].AsInt();
  r.added_at_ms = v[7].AsInt();
  r.attempts = static_cast<int>(v[8].AsInt());
  return r;
}

class SqlOutboxSession final : public OutboxSession {
 public:
  SqlOutboxSession(SqlStore& store, std::unique_ptr<Connection> conn, std::string name)
      : store_(store), sql_(store.outbox_sql()), conn_(std::move(conn)), name_(std::move(name)) {}
  ~SqlOutboxSession() override {
    locks_.clear();  // before the connection they were taken on
    if (conn_->Healthy()) {
      Value p[] = {name_};
      (void)conn_->Exec(kForgetRelay, p);
    }
  }

  Result<int> Rebalance() override {
    const int64_t now = store_.env()->NowMs();
    IDEM_RETURN_IF_ERROR(Renew(now));
    for (auto it = locks_.begin(); it != locks_.end();) it = it->second->Held() ? std::next(it) : locks_.erase(it);
    Value hb[] = {name_, static_cast<int64_t>(locks_.size()), now};
    IDEM_RETURN_IF_ERROR(conn_->Exec(sql_.heartbeat, hb).status());
    Value since[] = {now, kLiveMs};
    IDEM_ASSIGN_OR_RETURN(Rows live, conn_->Query(sql_.live_relays, since));
    const int64_t relays = std::max<int64_t>(1, live.rows.empty() ? 1 : live.rows[0][0].AsInt());
    const size_t share = static_cast<size_t>((sql_.lanes + relays - 1) / relays);
    while (locks_.size() > share) locks_.erase(std::prev(locks_.end()));  // give back the highest
    std::vector<int> taken;
    for (int k = 0; k < sql_.lanes && locks_.size() < share; ++k) {
      const int lane = (k + offset_) % sql_.lanes;
      if (locks_.count(lane)) continue;
      IDEM_ASSIGN_OR_RETURN(auto lock, store_.LockLane(*conn_, lane, name_));
      if (lock == nullptr) continue;
      locks_.emplace(lane, std::move(lock));
      taken.push_back(lane);
    }
    // Where earlier holders got to: rows up to there may be in a broker.
    std::vector<int> in_table;
    for (int lane : taken) {
      if (auto hint = locks_[lane]->ReadHint()) {
        handed_[lane] = *hint;
      } else {
        in_table.push_back(lane);
      }
    }
    if (!in_table.empty()) {
      Value p[] = {List(sql_.list_open, in_table)};
      IDEM_ASSIGN_OR_RETURN(Rows handed, conn_->Query(sql_.handed_read, p));
      for (const auto& row : handed.rows) handed_[static_cast<int>(row[0].AsInt())] = row[1].AsInt();
    }
    lanes_text_ = List(sql_.list_open, Lanes());
    return static_cast<int>(locks_.size());
  }

  Result<std::vector<OutboxRow>> Fetch(int limit, int64_t* republished) override {
    IDEM_RETURN_IF_ERROR(RenewIfDue());
    if (locks_.empty()) return std::vector<OutboxRow>{};
    Value p[] = {lanes_text_, limit};
    IDEM_ASSIGN_OR_RETURN(Rows rows, conn_->Query(sql_.fetch, p));
    std::vector<OutboxRow> out;
    out.reserve(rows.rows.size());
    int64_t again = 0;
    for (const auto& v : rows.rows) {
      IDEM_ASSIGN_OR_RETURN(OutboxRow r, RowFrom(v));
      auto h = handed_.find(static_cast<int>(v[9].AsInt()));
      if (r.attempts > 0 || (h != handed_.end() && r.seq <= h->second)) ++again;
      out.push_back(std::move(r));
    }
    if (republished != nullptr) *republished = again;
    return out;
  }

  Status NoteHanded(std::span<const OutboxRow> rows) override {
    std::map<int, int64_t> upto;
    for (const OutboxRow& r : rows) {
      const int lane = static_cast<int>(OutboxKeyHash(KeyOrId(r)) % static_cast<uint64_t>(sql_.lanes));
      upto[lane] = std::max(upto[lane], r.seq);
    }
    std::vector<int> lanes;
    std::vector<int64_t> seqs;
    for (const auto& [lane, seq] : upto) {
      if (handed_[lane] >= seq) continue;
      handed_[lane] = seq;
      auto lock = locks_.find(lane);
      if (lock != locks_.end() && lock->second->WriteHint(seq)) continue;
      lanes.push_back(lane);
      seqs.push_back(seq);
    }
    if (lanes.empty()) return Status::OK();
    Value p[] = {List(sql_.list_open, lanes), List(sql_.list_open, seqs)};
    return conn_->Exec(sql_.handed_write, p).status();
  }

  Status Settle(const OutboxSettlement& s) override {
    if (s.sent.empty() && s.dead.empty() && s.failed.empty()) return Status::OK();
    if (s.dead.empty() && s.failed.empty() && sql_.move_sent_one != nullptr) {
      // Only sent rows: one statement, atomic on its own.
      Value p[] = {List(sql_.list_open, s.sent), s.now_ms};
      IDEM_KILL_POINT("relay.before_settle_commit");
      return s.keep_sent ? conn_->Exec(sql_.move_sent_one, p).status()
                         : conn_
                               ->Exec(sql_.delete_sent_one != nullptr ? sql_.delete_sent_one : sql_.delete_rows,
                                      std::span<const Value>(p, 1))
                               .status();
    }
    // BEGIN on its own: a relay's connection is never replaced under it (a
    // held-back BEGIN would reconnect a connection found dead).
    IDEM_RETURN_IF_ERROR(conn_->Script(store_.dialect().begin));
    Status st;
    if (sql_.settle_prologue != nullptr && !conn_->Defer(sql_.settle_prologue, {}))
      st = conn_->Exec(sql_.settle_prologue, {}).status();
    if (st.ok()) st = SettleIn(s);
    IDEM_KILL_POINT("relay.before_settle_commit");
    if (st.ok()) st = conn_->Commit();
    if (!st.ok() && conn_->Healthy() && conn_->InTransaction()) (void)conn_->Script("ROLLBACK");
    return st;
  }

  Status Wait(int64_t timeout_ms) override {
    IDEM_RETURN_IF_ERROR(RenewIfDue());
    return store_.WaitForOutbox(*conn_, name_, timeout_ms, [this]() -> Result<bool> {
      Value p[] = {lanes_text_};
      IDEM_ASSIGN_OR_RETURN(Rows r, conn_->Query(sql_.any_pending, p));
      return !r.rows.empty();
    });
  }

  bool Alive() override {
    if (!conn_->Healthy()) return false;
    for (auto& [lane, lock] : locks_)
      if (!lock->Held()) return false;
    return true;
  }

 private:
  // Leased lanes (PostgreSQL) are renewed at each rebalance and, whatever
  // rebalance_ms is, at least every kRenewMs of fetching or waiting.
  static constexpr int64_t kRenewMs = 3'000;
  Status Renew(int64_t now) {
    renewed_at_ = now;
    return store_.RenewLanes(*conn_, name_, locks_);
  }
  Status RenewIfDue() {
    const int64_t now = store_.env()->NowMs();
    return now - renewed_at_ >= kRenewMs ? Renew(now) : Status::OK();
  }

  std::vector<int> Lanes() const {
    std::vector<int> v;
    for (const auto& [lane, lock] : locks_) v.push_back(lane);
    return v;
  }

  Status SettleIn(const OutboxSettlement& s) {
    if (!s.sent.empty()) {
      Value p[] = {List(sql_.list_open, s.sent), s.now_ms};
      if (s.keep_sent) IDEM_RETURN_IF_ERROR(conn_->Exec(sql_.move_sent, p).status());
      IDEM_RETURN_IF_ERROR(conn_->Exec(sql_.delete_rows, std::span<const Value>(p, 1)).status());
    }
    for (const OutboxDeadLetter& d : s.dead) {
      Value p[] = {d.row.seq, d.reason, d.error, d.at_ms};
      IDEM_RETURN_IF_ERROR(conn_->Exec(sql_.put_dead, p).status());
      Value q[] = {List(sql_.list_open, std::vector<int64_t>{d.row.seq})};
      IDEM_RETURN_IF_ERROR(conn_->Exec(sql_.delete_rows, q).status());
    }
    for (const auto& [seq, error] : s.failed) {
      Value p[] = {seq, error};
      IDEM_RETURN_IF_ERROR(conn_->Exec(kNoteFailure, p).status());
    }
    return Status::OK();
  }

  SqlStore& store_;
  const OutboxSql& sql_;
  std::unique_ptr<Connection> conn_;
  std::string name_;
  std::map<int, std::unique_ptr<SqlStore::LaneLock>> locks_;
  std::map<int, int64_t> handed_;
  std::string lanes_text_;
  int offset_ = 0;
  int64_t renewed_at_ = 0;
};

}  // namespace

Status SqlStore::WriteOutbox(Connection& tx, std::vector<OutboxRow>& rows) {
  const OutboxSql& sql = *dialect_.outbox;
  if (sql.lock_keys != nullptr) {
    std::set<int32_t> keys;  // sorted: two transactions lock shared keys in one order
    for (const OutboxRow& r : rows)
      if (!r.key.empty()) keys.insert(static_cast<int32_t>(OutboxKeyHash(r.key) & 0xffffffffu));
    Value p[] = {List(sql.list_open, keys)};
    IDEM_RETURN_IF_ERROR(tx.Query(sql.lock_keys, p).status());
  }
  auto params_of = [&](OutboxRow& r, std::vector<Value>& params) {
    params.emplace_back(sql.lanes == 1
                            ? int64_t{0}
                            : static_cast<int64_t>(OutboxKeyHash(KeyOrId(r)) % static_cast<uint64_t>(sql.lanes)));
    params.emplace_back(Blob{std::move(r.id)});
    params.emplace_back(std::move(r.destination));
    params.emplace_back(Blob{std::move(r.key)});
    params.emplace_back(Blob{std::move(r.payload)});
    params.emplace_back(Blob{internal::EncodeHeaders(r.headers)});
    params.emplace_back(r.producer_time_ms);
    params.emplace_back(r.added_at_ms);
  };
  if (sql.insert_one != nullptr) {
    IDEM_ASSIGN_OR_RETURN(Rows counter, tx.Query(sql.read_seq, {}));
    if (counter.rows.empty()) return Status::Corruption("idem_outbox_counter has no row");
    int64_t seq = counter.rows[0][0].AsInt();
    Value n[] = {static_cast<int64_t>(rows.size())};
    IDEM_RETURN_IF_ERROR(tx.Exec(sql.advance_seq, n).status());
    std::vector<Value> params;
    for (OutboxRow& r : rows) {
      params.clear();
      params_of(r, params);
      params.emplace_back(++seq);
      IDEM_RETURN_IF_ERROR(tx.Exec(sql.insert_one, params).status());
    }
    return Status::OK();
  }
  for (size_t at = 0; at < rows.size(); at += kRowsPerInsert) {
    const size_t n = std::min(kRowsPerInsert, rows.size() - at);
    std::string text = sql.insert_head;
    std::vector<Value> params;
    params.reserve(n * 8);
    for (size_t i = 0; i < n; ++i) {
      OutboxRow& r = rows[at + i];
      const size_t b = params.size();
      text += i == 0 ? "(" : ",(";
      for (int k = 1; k <= 8; ++k) text += (k == 1 ? "$" : ",$") + std::to_string(b + k);
      text += ")";
      params_of(r, params);
    }
    text += sql.insert_tail;
    IDEM_RETURN_IF_ERROR(tx.Query(text, params).status());
  }
  return Status::OK();
}

Result<std::unique_ptr<SqlStore::LaneLock>> SqlStore::LockLane(Connection&, int, std::string_view) {
  return Status::InvalidArgument("this store has no outbox lanes");
}

Status SqlStore::WaitForOutbox(Connection&, std::string_view, int64_t timeout_ms,
                               const std::function<Result<bool>()>& pending) {
  // Polling: look every 50 ms until rows show up or the time is over.
  for (int64_t waited = 0; waited < timeout_ms; waited += 50) {
    IDEM_ASSIGN_OR_RETURN(bool any, pending());
    if (any) return Status::OK();
    env_->SleepMs(std::min<int64_t>(50, timeout_ms - waited));
  }
  return Status::OK();
}

OutboxStore* SqlStore::outbox_store() { return outbox_.get(); }

Result<std::unique_ptr<OutboxSession>> SqlOutbox::OpenSession(std::string_view name) {
  IDEM_ASSIGN_OR_RETURN(auto conn, store_.ConnectRelay());
  const OutboxSql& sql = store_.outbox_sql();
  if (sql.session_setup != nullptr && *sql.session_setup) IDEM_RETURN_IF_ERROR(conn->Script(sql.session_setup));
  return std::unique_ptr<OutboxSession>(new SqlOutboxSession(store_, std::move(conn), std::string(name)));
}

Result<OutboxStats> SqlOutbox::Stats() {
  Value p[] = {store_.env()->NowMs(), kLiveMs};
  IDEM_ASSIGN_OR_RETURN(Rows r, store_.Read(store_.outbox_sql().stats, p));
  OutboxStats s;
  if (r.rows.empty()) return s;
  const auto& v = r.rows[0];
  s.backlog = v[0].AsInt();
  if (!v[1].is_null()) s.oldest_unsent_ms = v[1].AsInt();
  s.dead_letters = v[2].AsInt();
  s.sent_kept = v[3].AsInt();
  s.relays = v[4].AsInt();
  return s;
}

Result<bool> SqlOutbox::HasUnsent() {
  IDEM_ASSIGN_OR_RETURN(Rows r, store_.Read("SELECT 1 FROM idem_outbox LIMIT 1", {}));
  return !r.rows.empty();
}

Result<std::vector<OutboxDeadLetter>> SqlOutbox::ListDeadLetters(int limit) {
  IDEM_RETURN_IF_ERROR(CheckListLimit(limit));
  Value p[] = {limit};
  IDEM_ASSIGN_OR_RETURN(Rows r, store_.Read(kListDead, p));
  std::vector<OutboxDeadLetter> out;
  for (const auto& v : r.rows) {
    IDEM_ASSIGN_OR_RETURN(OutboxRow row, RowFrom(v));
    out.push_back(OutboxDeadLetter{std::move(row), v[9].AsText(), v[10].AsText(), v[11].AsInt()});
  }
  return out;
}

Result<int64_t> SqlOutbox::PurgeOutbox(int64_t sent_before_ms, int64_t dead_before_ms, int batch_size) {
  if (batch_size < 1) return Status::InvalidArgument("purge batch size must be at least 1");
  int64_t total = 0;
  for (const auto& purge : {std::pair{kPurgeSent, sent_before_ms}, std::pair{kPurgeDead, dead_before_ms}}) {
    // Not a structured binding: clang before 16 cannot capture one in the lambda.
    const auto& stmt = purge.first;
    const int64_t before = purge.second;
    if (before <= 0) continue;
    for (;;) {
      int64_t n = 0;
      IDEM_RETURN_IF_ERROR(store_.OnPooled(
          [&](Lease& c) -> Status {
            Value p[] = {before, batch_size};
            IDEM_ASSIGN_OR_RETURN(n, c->Exec(stmt, p));
            return Status::OK();
          },
          /*for_write=*/true));
      total += n;
      if (n < batch_size) break;
    }
  }
  return total;
}

}  // namespace idem::sql_internal
