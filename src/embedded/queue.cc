// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/embedded/queue.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/publish_batch.h"
#include "core/saturating.h"
#include "embedded/rows.h"
#include "idem/url.h"
#include "sqlite_driver/db.h"

namespace idem::embedded {
namespace {

using embedded_internal::DecodeRow;
using embedded_internal::EncodeHeaders;
using sqlite_driver::Db;

constexpr int kQueueSchemaVersion = 1;
constexpr const char* kSchemaName = "idem-queue";

constexpr const char* kCreate =
    "CREATE TABLE idem_queue_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE idem_queue_messages("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " queue TEXT NOT NULL,"
    " id BLOB NOT NULL,"
    " producer_time_ms INTEGER,"
    " payload BLOB NOT NULL,"
    " headers BLOB NOT NULL,"
    " published_at_ms INTEGER NOT NULL,"
    " visible_at_ms INTEGER NOT NULL,"
    " deliveries INTEGER NOT NULL DEFAULT 0,"
    " lease TEXT);"
    "CREATE INDEX idem_queue_ready ON idem_queue_messages(queue, visible_at_ms, seq);"
    "CREATE TABLE idem_queue_counters(queue TEXT PRIMARY KEY, published INTEGER NOT NULL, acked INTEGER NOT NULL);";

class SqliteQueue final : public Queue {
 public:
  SqliteQueue(Options o, std::unique_ptr<Db> db) : o_(std::move(o)), db_(std::move(db)) {}

  Status Init() {
    IDEM_RETURN_IF_ERROR(db_->Script("BEGIN IMMEDIATE").WithContext("open queue " + o_.path));
    Status s = CheckOrCreate();
    if (!s.ok()) {
      (void)db_->Script("ROLLBACK");
      return s;
    }
    return db_->Script("COMMIT");
  }

  Status Publish(const Message& m) override {
    IDEM_RETURN_IF_ERROR(ValidateId(m.id));
    std::lock_guard<std::mutex> l(mu_);
    return InTx([&]() -> Status {
      IDEM_RETURN_IF_ERROR(InsertLocked(o_.queue, m, m.headers));
      return CountPublishedLocked(o_.queue, 1);
    });
  }

  // One transaction for every element that passes its checks: all of them
  // are stored, or none (each then answers the transaction's error). An
  // element refused by its checks (kInvalidArgument) is left out and does
  // not hold back the others.
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override {
    std::vector<Status> out(batch.size());
    std::vector<std::string_view> where(batch.size());
    bool any = false;
    for (size_t i = 0; i < batch.size(); ++i) {
      auto d = publish_internal::Destination(batch[i], o_.queue, "embedded queue", "queue");
      if (!d.ok()) {
        out[i] = d.status();
        continue;
      }
      where[i] = *d;
      any = true;
    }
    if (!any) return out;
    std::lock_guard<std::mutex> l(mu_);
    Status s = InTx([&]() -> Status {
      std::map<std::string_view, int64_t> counts;
      for (size_t i = 0; i < batch.size(); ++i) {
        if (!out[i].ok()) continue;
        const Message& m = *batch[i].message;
        IDEM_RETURN_IF_ERROR(InsertLocked(where[i], m, publish_internal::HeadersWithKey(m, batch[i].key)));
        ++counts[where[i]];
      }
      for (const auto& [queue, n] : counts) IDEM_RETURN_IF_ERROR(CountPublishedLocked(queue, n));
      return Status::OK();
    });
    if (!s.ok())
      for (Status& e : out)
        if (e.ok()) e = s;
    return out;
  }

  PublisherTraits traits() const override { return {.ordered_batch = true, .max_batch = 1000}; }
  std::string_view Channel() const override { return o_.queue; }

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    if (max < 1) return Status::InvalidArgument("Receive: max must be at least 1");
    const int64_t deadline = internal::SaturatingAdd(o_.env->NowMs(), wait_ms);
    for (;;) {
      IDEM_ASSIGN_OR_RETURN(auto got, TryReceive(max));
      if (!got.empty() || o_.env->NowMs() >= deadline) return got;
      o_.env->SleepMs(o_.poll_ms);
    }
  }

  Status Ack(const Delivery& d) override {
    IDEM_ASSIGN_OR_RETURN(auto r, ParseReceipt(d.receipt));
    std::lock_guard<std::mutex> l(mu_);
    return InTx([&]() -> Status {
      IDEM_RETURN_IF_ERROR(OnHeldLocked(
          "DELETE FROM idem_queue_messages", {}, r,
          "ack of " + d.message.id + ": its lease expired and it was redelivered, or it was acked already"));
      Value q[] = {o_.queue};
      return db_->Exec("UPDATE idem_queue_counters SET acked = acked + 1 WHERE queue = $1", q).status();
    });
  }

  Status Nack(const Delivery& d, int64_t delay_ms) override {
    IDEM_ASSIGN_OR_RETURN(auto r, ParseReceipt(d.receipt));
    std::lock_guard<std::mutex> l(mu_);
    return InTx([&]() -> Status {
      return OnHeldLocked("UPDATE idem_queue_messages SET visible_at_ms = $1, lease = NULL",
                          {internal::SaturatingAdd(o_.env->NowMs(), std::max<int64_t>(0, delay_ms))}, r,
                          "nack of " + d.message.id + ": lease no longer held");
    });
  }

  int64_t lease_ms() const override { return o_.lease_ms; }

  Status ExtendLease(const Delivery& d) override {
    IDEM_ASSIGN_OR_RETURN(auto r, ParseReceipt(d.receipt));
    std::lock_guard<std::mutex> l(mu_);
    return InTx([&]() -> Status {
      return OnHeldLocked(
          "UPDATE idem_queue_messages SET visible_at_ms = $1", {internal::SaturatingAdd(o_.env->NowMs(), o_.lease_ms)},
          r,
          "lease extension of " + d.message.id + ": its lease expired and it was redelivered, or it was acked already");
    });
  }

  // The first message enqueued of those still in the queue: an Ack deletes,
  // so every one left may still be delivered. Messages are stamped in their
  // write transaction, so seq order is publish order (on a clock that does
  // not step back), and the oldest is one row: the table in seq order, not
  // min(published_at_ms) over the backlog, which reads every row of it (the
  // horizon gauge asks while the consumer runs).
  Result<RedeliveryHorizon> Horizon() override {
    std::lock_guard<std::mutex> l(mu_);
    Value q[] = {o_.queue};
    IDEM_ASSIGN_OR_RETURN(Rows rows, db_->Query("SELECT published_at_ms FROM idem_queue_messages NOT INDEXED"
                                                " WHERE queue = $1 ORDER BY seq LIMIT 1",
                                                q));
    if (rows.rows.empty()) return RedeliveryHorizon::None();
    return RedeliveryHorizon::At(rows.rows[0][0].AsInt());
  }

  Result<QueueStats> Stats() override {
    std::lock_guard<std::mutex> l(mu_);
    QueueStats s;
    int64_t now = o_.env->NowMs();
    Value p[] = {o_.queue, now};
    IDEM_ASSIGN_OR_RETURN(Rows rows, db_->Query("SELECT coalesce(sum(visible_at_ms <= $2), 0),"
                                                " coalesce(sum(visible_at_ms > $2 AND lease IS NOT NULL), 0),"
                                                " coalesce(sum(visible_at_ms > $2 AND lease IS NULL), 0)"
                                                " FROM idem_queue_messages WHERE queue = $1",
                                                p));
    s.ready = rows.rows[0][0].AsInt();
    s.leased = rows.rows[0][1].AsInt();
    s.delayed = rows.rows[0][2].AsInt();
    Value q[] = {o_.queue};
    IDEM_ASSIGN_OR_RETURN(Rows c, db_->Query("SELECT published, acked FROM idem_queue_counters WHERE queue = $1", q));
    if (!c.rows.empty()) {
      s.published = c.rows[0][0].AsInt();
      s.acked = c.rows[0][1].AsInt();
    }
    return s;
  }

 private:
  // Appends one message to `queue` (inside a transaction).
  Status InsertLocked(std::string_view queue, const Message& m,
                      const std::vector<std::pair<std::string, std::string>>& headers) {
    const int64_t now = o_.env->NowMs();
    Value p[] = {std::string(queue),
                 Blob{m.id},
                 m.producer_time_ms ? Value(*m.producer_time_ms) : Value(),
                 Blob{m.payload},
                 Blob{EncodeHeaders(headers)},
                 now,
                 now};
    return db_
        ->Exec(
            "INSERT INTO idem_queue_messages(queue, id, producer_time_ms, payload, headers,"
            " published_at_ms, visible_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            p)
        .status();
  }
  Status CountPublishedLocked(std::string_view queue, int64_t n) {
    Value q[] = {std::string(queue), n};
    return db_
        ->Exec(
            "INSERT INTO idem_queue_counters(queue, published, acked) VALUES ($1, $2, 0)"
            " ON CONFLICT (queue) DO UPDATE SET published = published + $2",
            q)
        .status();
  }

  template <typename F>
  Status InTx(F&& body) {
    IDEM_RETURN_IF_ERROR(db_->Script("BEGIN IMMEDIATE").WithContext("queue " + o_.path));
    Status s = body();
    if (!s.ok()) {
      (void)db_->Script("ROLLBACK");
      return s;
    }
    s = db_->Script("COMMIT");
    if (!s.ok() && db_->in_transaction()) (void)db_->Script("ROLLBACK");
    return s;
  }

  // Runs `statement` (a DELETE, or an UPDATE ... SET with parameters
  // $1..$n in `params`) on the message only while the receipt still holds
  // its lease: the one check Ack, Nack and ExtendLease share. The lease
  // token changes at every Receive, so a receipt whose lease expired still
  // matches until someone else receives the message (nobody was harmed by
  // the lateness), and never after. The queue name is checked too: a
  // receipt from another queue in the same file must not touch (and count)
  // that queue's message. kLeaseLost with `lost` when nothing matched.
  Status OnHeldLocked(std::string_view statement, std::vector<Value> params,
                      const std::pair<int64_t, std::string>& receipt, std::string lost) {
    const size_t n = params.size();
    params.insert(params.end(), {receipt.first, receipt.second, o_.queue});
    const std::string sql = std::string(statement) + " WHERE seq = $" + std::to_string(n + 1) + " AND lease = $" +
                            std::to_string(n + 2) + " AND queue = $" + std::to_string(n + 3);
    IDEM_ASSIGN_OR_RETURN(int64_t changed, db_->Exec(sql, params));
    if (changed == 0) return Status::LeaseLost(std::move(lost));
    return Status::OK();
  }

  Result<std::vector<Delivery>> TryReceive(int max) {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<Delivery> out;
    Status s = InTx([&]() -> Status {
      int64_t now = o_.env->NowMs();
      Value p[] = {o_.queue, now, int64_t{max}};
      IDEM_ASSIGN_OR_RETURN(Rows rows, db_->Query(std::string("SELECT ") + embedded_internal::kReceiveColumns +
                                                      " FROM idem_queue_messages WHERE queue = $1 AND visible_at_ms <= "
                                                      "$2 ORDER BY visible_at_ms, seq LIMIT $3",
                                                  p));
      for (auto& r : rows.rows) {
        // The lease token names this delivery: its number (deliveries only
        // grows) and a random part. The number alone makes a stale receipt
        // unable to match a later delivery of the same message, even when two
        // handles draw the same random numbers (two FakeEnvs with one seed,
        // or processes forked from one parent that share an RNG state).
        const int64_t delivery = embedded_internal::NextDelivery(r);
        char token[48];
        std::snprintf(token, sizeof token, "%lld.%016llx", static_cast<long long>(delivery),
                      static_cast<unsigned long long>(o_.env->Random()));
        Value u[] = {internal::SaturatingAdd(now, o_.lease_ms), std::string(token), r[0].AsInt()};
        IDEM_RETURN_IF_ERROR(db_->Exec("UPDATE idem_queue_messages SET visible_at_ms = $1, lease = $2,"
                                       " deliveries = deliveries + 1 WHERE seq = $3",
                                       u)
                                 .status());
        IDEM_ASSIGN_OR_RETURN(Delivery d, DecodeRow(r, token));
        out.push_back(std::move(d));
      }
      return Status::OK();
    });
    if (!s.ok()) return s;
    return out;
  }

  static Result<std::pair<int64_t, std::string>> ParseReceipt(const std::string& receipt) {
    auto colon = receipt.find(':');
    if (colon == std::string::npos || colon == 0)
      return Status::InvalidArgument("not an embedded-queue receipt: '" + receipt + "'");
    return std::make_pair(int64_t{std::strtoll(receipt.c_str(), nullptr, 10)}, receipt.substr(colon + 1));
  }

  Status CheckOrCreate() {
    IDEM_ASSIGN_OR_RETURN(Rows tables, db_->Query("SELECT name FROM sqlite_schema WHERE type = 'table'", {}));
    bool has_meta = false, idem_store = false;
    for (auto& r : tables.rows) {
      std::string n = r[0].AsText();
      if (n == "idem_queue_meta") has_meta = true;
      if (n == "idem_markers" || n == "idem_migrations") idem_store = true;
    }
    if (!has_meta) {
      if (idem_store)
        return Status::SchemaMismatch(o_.path +
                                      " is an idem store (markers), not a queue file: give the queue its own file");
      if (!tables.rows.empty())
        return Status::SchemaMismatch(o_.path + " holds other tables (" + tables.rows[0][0].AsText() +
                                      ", ...) and is not an idem queue file");
      IDEM_RETURN_IF_ERROR(db_->Script(kCreate));
      Value p[] = {std::string(kSchemaName), std::to_string(kQueueSchemaVersion)};
      return db_->Exec("INSERT INTO idem_queue_meta(key, value) VALUES ('schema', $1), ('version', $2)", p).status();
    }
    IDEM_ASSIGN_OR_RETURN(Rows meta, db_->Query("SELECT key, value FROM idem_queue_meta", {}));
    std::string schema, version;
    for (auto& r : meta.rows) {
      if (r[0].AsText() == "schema") schema = r[1].AsText();
      if (r[0].AsText() == "version") version = r[1].AsText();
    }
    if (schema != kSchemaName)
      return Status::SchemaMismatch(o_.path + " is not an idem queue file (schema '" + schema + "')");
    if (std::atoi(version.c_str()) != kQueueSchemaVersion)
      return Status::SchemaMismatch(o_.path + " has queue schema version " + version + "; this build reads version " +
                                    std::to_string(kQueueSchemaVersion));
    return Status::OK();
  }

  Options o_;
  std::mutex mu_;
  std::unique_ptr<Db> db_;
};

}  // namespace

Result<std::unique_ptr<Queue>> Queue::Open(const Options& options) {
  Options o = options;
  if (o.path.empty()) return Status::InvalidArgument("embedded queue: path is empty");
  if (o.queue.empty()) return Status::InvalidArgument("embedded queue: queue name is empty");
  if (o.lease_ms < 1)
    return Status::InvalidArgument("embedded queue: lease_ms must be positive, got " + std::to_string(o.lease_ms));
  if (o.busy_timeout_ms < 0 || o.busy_timeout_ms > std::numeric_limits<int>::max())
    return Status::InvalidArgument("embedded queue: busy_timeout_ms must be 0.." +
                                   std::to_string(std::numeric_limits<int>::max()) + ", got " +
                                   std::to_string(o.busy_timeout_ms));
  if (o.env == nullptr) o.env = Env::Default();
  if (o.poll_ms < 1) o.poll_ms = 1;
  sqlite_driver::OpenOptions oo;
  oo.path = o.path;
  oo.busy_timeout_ms = static_cast<int>(o.busy_timeout_ms);
  oo.synchronous = o.durable ? "FULL" : "NORMAL";
  oo.cache_kib = 2048;
  oo.vfs = o.vfs;
  IDEM_ASSIGN_OR_RETURN(auto db, Db::Open(oo));
  auto q = std::make_unique<SqliteQueue>(o, std::move(db));
  IDEM_RETURN_IF_ERROR(q->Init());
  return std::unique_ptr<Queue>(std::move(q));
}

Result<Queue::Options> Queue::ParseUrl(std::string_view url) {
  if (UrlScheme(url) != "embedded")
    return Status::InvalidArgument("not an embedded queue URL: '" + RedactUrl(url) + "' (expected embedded:PATH)");
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, idem::ParseUrl(url, "embedded queue URL", UrlForm::kFile));
  IDEM_RETURN_IF_ERROR(u.CheckKeys({"queue", "lease_ms", "durable", "busy_timeout_ms", "poll_ms", "vfs"}));
  Options o;
  if (u.path.empty()) return Status::InvalidArgument("embedded queue URL has no path: '" + RedactUrl(url) + "'");
  o.path = u.path;
  // A key given with no value would otherwise fall back to a default silently.
  for (std::string_view k : {"queue", "vfs"})
    if (u.Has(k) && u.Get(k).empty())
      return Status::InvalidArgument("embedded queue URL: " + std::string(k) + " is empty in '" + RedactUrl(url) + "'");
  o.queue = u.Get("queue", o.queue);
  o.vfs = u.Get("vfs", o.vfs);
  IDEM_ASSIGN_OR_RETURN(o.lease_ms, u.GetInt("lease_ms", o.lease_ms, 1, std::numeric_limits<int64_t>::max()));
  IDEM_ASSIGN_OR_RETURN(o.busy_timeout_ms,
                        u.GetInt("busy_timeout_ms", o.busy_timeout_ms, 0, std::numeric_limits<int>::max()));
  IDEM_ASSIGN_OR_RETURN(o.poll_ms, u.GetInt("poll_ms", o.poll_ms, 1, 3'600'000));
  IDEM_ASSIGN_OR_RETURN(o.durable, u.GetBool("durable", o.durable));
  return o;
}

}  // namespace idem::embedded
