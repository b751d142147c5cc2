// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem bench peers: idem on the peers' workload (../shared/peers), speaking
// their result line, so it can run in the same round as they do
// (bench/peers/run-with-idem.sh adds it to their run-all.sh).
//
// N unique messages, each delivered DUP times in passes (all ids, then all
// again), CONCURRENCY deliveries in flight (one worker thread each); id i is
// the UUID 00000000-0000-4000-8000-<i as 12 hex digits>, amount (i % 1000) + 1
// cents; the handler inserts one payments row. Per delivery (or per batch of
// --batch deliveries): one transaction with the marker, committed before the
// next, as durable as the server's synchronous_commit.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <span>
#include <thread>
#include <unordered_set>
#include <vector>

#include "commands.h"
#include "idem/inbox.h"
#include "payments.h"

namespace idem::cli {

int RunBenchPeers(const Args& args) {
  const std::string cmd = "bench peers";
  if (args.Bool("json"))  // its output is the peers' result line, for their scripts
    return Fail(cmd, Status::InvalidArgument("--json: bench peers prints the peers' result line, not JSON"));
  auto env_or = [&](const char* flag, const char* var, int64_t def) -> Result<int64_t> {
    if (args.Has(flag)) return args.GetInt(flag);
    const char* v = std::getenv(var);
    if (v == nullptr || *v == '\0') return def;
    const std::optional<int64_t> n = ParseInteger(v);
    if (!n) return Status::InvalidArgument(std::string(var) + " must be an integer, not '" + v + "'");
    return *n;
  };
  auto n = env_or("n", "N", 20000);
  auto dup = env_or("dup", "DUP", 2);
  auto conc = env_or("concurrency", "CONCURRENCY", 16);
  auto batch = args.GetInt("batch");
  for (const auto* r : {&n, &dup, &conc, &batch})
    if (!r->ok()) return Fail(cmd, r->status());
  if (*n < 1 || *dup < 1 || *conc < 1 || *conc > 256 || *batch < 1 || *batch > 10000)
    return Fail(cmd, Status::InvalidArgument("need N >= 1, DUP >= 1, 1 <= CONCURRENCY <= 256, 1 <= --batch <= 10000"));

  // Default: PostgreSQL as the PG* environment says (the peers' services.sh env).
  auto store = OpenStore(args.Has("store") ? args.Get("store") : "postgresql://");
  if (!store.ok()) return Fail(cmd, store.status());
  Store& s = **store;
  const std::string consumer = "peers";
  // A store without SQL (DynamoDB) writes the payments effect of payments.h
  // (an item per delivery applied), the SQL stores the peers' own table.
  const bool sql = s.Kind() != "dynamodb";
  if (sql) {
    auto tx = s.Begin();
    if (!tx.ok()) return Fail(cmd, tx.status());
    for (const char* stmt : {"DROP TABLE IF EXISTS payments",
                             "CREATE TABLE payments(message_id text NOT NULL, amount_cents integer NOT NULL)"}) {
      if (auto r = (*tx)->Exec(stmt); !r.ok()) return Fail(cmd, r.status());
    }
    if (Status st = (*tx)->Commit(); !st.ok()) return Fail(cmd, st);
  } else if (Status st = ResetPayments(s, "payments"); !st.ok()) {
    return Fail(cmd, st);
  }
  if (auto p = s.Purge(consumer, INT64_MAX, 10000); !p.ok()) return Fail(cmd, p.status());

  // The deliveries in passes, as the peers make them.
  std::vector<Message> deliveries;
  deliveries.reserve(static_cast<size_t>(*n * *dup));
  for (int64_t d = 0; d < *dup; ++d) {
    for (int64_t i = 0; i < *n; ++i) {
      char id[64];
      std::snprintf(id, sizeof id, "00000000-0000-4000-8000-%012llx", static_cast<unsigned long long>(i));
      Message m;
      m.id = id;
      m.payload = sql ? std::to_string(i % 1000 + 1) : PaymentPayload("o" + std::to_string(i), i % 1000 + 1);
      deliveries.push_back(std::move(m));
    }
  }
  auto inbox_owned = Inbox::Open(s, Inbox::Options{.consumer = consumer});
  if (!inbox_owned.ok()) return Fail(cmd, inbox_owned.status());
  Inbox& inbox = **inbox_owned;
  Handler handler = [sql](Transaction& tx, const Message& m) {
    if (!sql) return InsertPayment(tx, m, "", "payments");
    return tx
        .Exec("INSERT INTO payments(message_id, amount_cents) VALUES ($1, $2)", {m.id, std::atoll(m.payload.c_str())})
        .status();
  };
  std::atomic<size_t> next{0};
  std::atomic<int64_t> failures{0};
  const size_t total = deliveries.size(), step = static_cast<size_t>(*batch);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int64_t w = 0; w < *conc; ++w) {
    workers.emplace_back([&] {
      for (;;) {
        size_t at = next.fetch_add(step);
        if (at >= total) return;
        std::span<const Message> chunk(deliveries.data() + at, std::min(step, total - at));
        // A failed delivery is delivered again, as a broker would.
        for (int tries = 0; tries < 100; ++tries) {
          bool all_done = true;
          for (const Outcome& o : inbox.HandleBatch(chunk, handler)) all_done &= o.ShouldAck();
          if (all_done) break;
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int64_t rows = -1, distinct = -1;
  if (sql) {
    auto tx = s.Begin();
    if (!tx.ok()) return Fail(cmd, tx.status());
    auto r = (*tx)->Query("SELECT count(*), count(DISTINCT message_id) FROM payments");
    if (!r.ok()) return Fail(cmd, r.status());
    rows = r->rows[0][0].AsInt();
    distinct = r->rows[0][1].AsInt();
  } else {
    auto r = ReadPayments(s, "payments");
    if (!r.ok()) return Fail(cmd, r.status());
    std::unordered_set<std::string> ids;
    for (const PaymentRow& row : *r) ids.insert(row.message_id);
    rows = static_cast<int64_t>(r->size());
    distinct = static_cast<int64_t>(ids.size());
  }
  auto markers = s.CountMarkers(consumer);
  if (!markers.ok()) return Fail(cmd, markers.status());
  InboxCounters c = inbox.counters();
  const bool ok = rows == *n && distinct == *n && *markers == *n && c.applied == static_cast<uint64_t>(*n) &&
                  c.duplicates == static_cast<uint64_t>(*n * (*dup - 1));
  std::printf(
      "info: concurrency=%lld batch=%lld applied=%llu skipped_duplicates=%llu retried_failures=%lld "
      "payments=%lld distinct=%lld markers=%lld ok=%s\n",
      static_cast<long long>(*conc), static_cast<long long>(*batch), static_cast<unsigned long long>(c.applied),
      static_cast<unsigned long long>(c.duplicates), static_cast<long long>(failures.load()),
      static_cast<long long>(rows), static_cast<long long>(distinct), static_cast<long long>(*markers),
      ok ? "true" : "false");
  return PeerResult(*batch > 1 ? "idem-batch" + std::to_string(*batch) : "idem", s.Kind(), *n,
                    static_cast<int64_t>(total), seconds, rows, ok);
}

}  // namespace idem::cli
