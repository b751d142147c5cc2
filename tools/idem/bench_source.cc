// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem bench source: what the guard and the store cost on top of a broker.
// Rounds alternate, each on freshly published messages (--messages, of which
// --dup-rate are published twice):
//   raw:     the broker's own consume-and-ack rate, no database (Receive,
//            AckBatch: each batch's acks in one call where the broker has one)
//   guarded: the Consumer runner with the Inbox on --store (commit, then ack)
// and prints deliveries/s of each and the ratio raw/guarded.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "commands.h"
#include "idem/consumer.h"
#include "idem/inbox.h"
#include "sources.h"

namespace idem::cli {
namespace {

// Publishes `n` messages (some twice); returns the deliveries published.
Result<int64_t> PublishRound(OpenedSource& src, const std::string& tag, int64_t n, double dup, std::mt19937_64& rng) {
  int64_t published = 0;
  for (int64_t i = 0; i < n; ++i) {
    Message m;
    m.id = tag + "-" + std::to_string(i);
    m.payload = "order-" + std::to_string(i) + ":" + std::to_string(100 + rng() % 100'000);
    m.producer_time_ms = Env::Default()->NowMs();
    const int copies = (static_cast<double>(rng() % 1'000'000) / 1e6) < dup ? 2 : 1;
    for (int k = 0; k < copies; ++k) {
      IDEM_RETURN_IF_ERROR(src.publish(m));
      ++published;
    }
  }
  return published;
}

// Receives and acks `expect` deliveries with `workers` threads; seconds taken.
Result<double> DrainRaw(Source& source, int64_t expect, int workers, int batch) {
  std::atomic<int64_t> done{0};
  std::atomic<bool> failed{false};
  Status error;
  std::mutex mu;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      int idle = 0;
      while (done.load() < expect && !failed.load() && idle < 50) {
        auto got = source.Receive(batch, 100);
        if (!got.ok()) {
          std::lock_guard lock(mu);
          error = got.status();
          failed = true;
          return;
        }
        idle = got->empty() ? idle + 1 : 0;
        // The batch's acks together, as the Consumer sends them
        // (Source::AckBatch: one call where the broker takes several).
        const std::vector<Status> acked = source.AckBatch(*got);
        for (const Status& s : acked) {
          if (!s.ok() && s.code() != Code::kLeaseLost) {
            std::lock_guard lock(mu);
            error = s;
            failed = true;
            return;
          }
          done.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failed) return error;
  if (done.load() < expect)
    return Status::Internal("raw drain stopped at " + std::to_string(done.load()) + " of " + std::to_string(expect));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int RunBenchSource(const Args& args) {
  const std::string cmd = "bench source";
  if (!args.Has("source")) return Fail(cmd, Status::InvalidArgument("--source is required"));
  auto n = args.Has("messages") ? args.GetInt("messages") : Result<int64_t>(10000);
  auto workers = args.Has("workers") ? args.GetInt("workers") : Result<int64_t>(4);
  auto batch = args.GetInt("batch");
  auto rounds = args.GetInt("rounds");
  for (const auto* r : {&n, &workers, &batch, &rounds})
    if (!r->ok()) return Fail(cmd, r->status());
  auto dup_rate = args.Has("dup-rate") ? args.GetDouble("dup-rate", 0, 1) : Result<double>(0.0);
  if (!dup_rate.ok()) return Fail(cmd, dup_rate.status());
  const double dup = *dup_rate;
  if (*n < 1 || *workers < 1 || *batch < 1 || *rounds < 1)
    return Fail(cmd, Status::InvalidArgument("need --messages, --workers, --batch, --rounds >= 1"));
  auto src = OpenSource(args.Get("source"), {.lease_ms = 60'000, .consumer = "bench"});
  if (!src.ok()) return Fail(cmd, src.status());
  auto store = OpenStore(args.Get("store"), true, static_cast<int>(*workers) + 2);
  if (!store.ok()) return Fail(cmd, store.status());
  {
    auto tx = (*store)->Begin();
    if (!tx.ok()) return Fail(cmd, tx.status());
    for (const char* sql : {"DROP TABLE IF EXISTS bench_source_payments",
                            "CREATE TABLE bench_source_payments(message_id TEXT NOT NULL, payload TEXT NOT NULL)"})
      if (auto r = (*tx)->Exec(sql); !r.ok()) return Fail(cmd, r.status());
    if (Status s = (*tx)->Commit(); !s.ok()) return Fail(cmd, s);
  }
  const std::string run = std::to_string(Env::Default()->NowMs());
  std::mt19937_64 rng(7);
  // Warm-up, untimed: connections, a consumer group's first join (Kafka).
  {
    auto warm = PublishRound(*src, "warm-" + run, 1, 0, rng);
    if (!warm.ok()) return Fail(cmd, warm.status());
    auto drained = DrainRaw(*src->source, *warm, 1, 1);
    if (!drained.ok()) return Fail(cmd, drained.status().WithContext("warm-up"));
  }
  std::vector<double> raw_rates, guarded_rates;
  int64_t applied_total = 0, unique_total = 0;
  for (int64_t round = 0; round < *rounds; ++round) {
    // raw
    auto pub = PublishRound(*src, "raw-" + run + "-" + std::to_string(round), *n, dup, rng);
    if (!pub.ok()) return Fail(cmd, pub.status());
    auto raw = DrainRaw(*src->source, *pub, static_cast<int>(*workers), static_cast<int>(*batch));
    if (!raw.ok()) return Fail(cmd, raw.status());
    raw_rates.push_back(static_cast<double>(*pub) / *raw);
    // guarded
    auto gpub = PublishRound(*src, "guarded-" + run + "-" + std::to_string(round), *n, dup, rng);
    if (!gpub.ok()) return Fail(cmd, gpub.status());
    auto inbox_owned = Inbox::Open(**store, Inbox::Options{.consumer = "bench-source"});
    if (!inbox_owned.ok()) return Fail(cmd, inbox_owned.status());
    Inbox& inbox = **inbox_owned;
    auto consumer_owned = Consumer::Open(
        *src->source, inbox,
        [](Transaction& tx, const Message& m) {
          return tx.Exec("INSERT INTO bench_source_payments(message_id, payload) VALUES ($1, $2)", {m.id, m.payload})
              .status();
        },
        Consumer::Options{.workers = static_cast<int>(*workers),
                          .batch = static_cast<int>(*batch),
                          .receive_wait_ms = 100,
                          .stop_when_idle = true});
    if (!consumer_owned.ok()) return Fail(cmd, consumer_owned.status());
    Consumer& consumer = **consumer_owned;
    auto t0 = std::chrono::steady_clock::now();
    if (Status s = consumer.Run(); !s.ok()) return Fail(cmd, s);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const InboxCounters c = inbox.counters();
    if (static_cast<int64_t>(c.applied + c.duplicates) < *gpub || static_cast<int64_t>(c.applied) != *n)
      return Fail(cmd, Status::Internal("guarded round " + std::to_string(round) + ": applied " +
                                        std::to_string(c.applied) + " of " + std::to_string(*n) + ", handled " +
                                        std::to_string(c.applied + c.duplicates) + " of " + std::to_string(*gpub)));
    guarded_rates.push_back(static_cast<double>(*gpub) / secs);
    applied_total += static_cast<int64_t>(c.applied);
    unique_total += *n;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  int64_t rows = -1;
  {
    auto tx = (*store)->Begin();
    if (!tx.ok()) return Fail(cmd, tx.status());
    auto r = (*tx)->Query("SELECT count(*) FROM bench_source_payments");
    if (!r.ok()) return Fail(cmd, r.status());
    rows = r->rows[0][0].AsInt();
  }
  const bool ok = rows == unique_total && applied_total == unique_total;
  const double raw_m = median(raw_rates), guarded_m = median(guarded_rates);
  std::printf(
      "source=%s store=%s messages=%lld dup_rate=%.2f workers=%lld batch=%lld rounds=%lld "
      "raw_per_s=%.1f guarded_per_s=%.1f ratio=%.2f effects=%lld ok=%s\n",
      src->kind.c_str(), std::string((*store)->Kind()).c_str(), static_cast<long long>(*n), dup,
      static_cast<long long>(*workers), static_cast<long long>(*batch), static_cast<long long>(*rounds), raw_m,
      guarded_m, raw_m / guarded_m, static_cast<long long>(rows), ok ? "true" : "false");
  std::fflush(stdout);
  if (!ok) {
    std::fprintf(stderr, "CORRECTNESS CHECK FAILED: %lld payment rows for %lld messages\n",
                 static_cast<long long>(rows), static_cast<long long>(unique_total));
    return kExitCheckFailed;
  }
  return kExitOk;
}

}  // namespace idem::cli
