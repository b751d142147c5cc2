// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem bench purge: does purging old markers stall a consumer? N markers are
// retained with processing times spread evenly over --days days; then, while
// a consumer thread keeps handling fresh messages (one transaction each) and
// timing every call, the oldest day is purged. It reports the purge's time
// and the consumer's worst and 99th-percentile call, next to the same
// consumer's calls measured for the same time just before, without purge.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>
#include <vector>

#include "commands.h"
#include "idem/env.h"
#include "idem/inbox.h"
#include "idem/testing/fake_env.h"
#include "marker_workload.h"

namespace idem::cli {
namespace {

struct Latencies {
  std::vector<double> ms;
  double Max() const { return ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end()); }
  double P99() {
    if (ms.empty()) return 0;
    std::sort(ms.begin(), ms.end());
    return ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  }
};

// Handles fresh messages until `stop`, timing each call.
Status Consume(Inbox& inbox, const std::atomic<bool>& stop, Latencies* out) {
  bench::IdGenerator ids(bench::IdKind::kRandom, bench::FreshSeed());
  std::vector<Message> one;
  while (!stop.load()) {
    bench::NextBatch(ids, one, 1);
    auto t0 = std::chrono::steady_clock::now();
    IDEM_RETURN_IF_ERROR(bench::GuardedBatch(inbox, one));
    out->ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return Status::OK();
}

}  // namespace

int RunBenchPurge(const Args& args) {
  const std::string cmd = "bench purge";
  auto retained = args.GetInt("retained", 1, int64_t{1} << 40);
  auto days = args.GetInt("days", 2, 3650);
  auto batch = args.GetInt("purge-batch", 1, 1'000'000);
  for (const auto* r : {&retained, &days, &batch})
    if (!r->ok()) return Fail(cmd, r->status());
  if (*retained < 1 || *days < 2 || *batch < 1)
    return Fail(cmd, Status::InvalidArgument("need --retained >= 1, --days >= 2, --purge-batch >= 1"));
  auto store = OpenStore(args.Get("store"));
  if (!store.ok()) return Fail(cmd, store.status());
  Store& s = **store;
  const std::string consumer = "bench-purge";
  if (Status st = bench::PrepareBusinessTable(s); !st.ok()) return Fail(cmd, st);
  if (auto p = s.Purge(consumer, INT64_MAX, 10000); !p.ok()) return Fail(cmd, p.status());

  // Retain with processing times spread over `days` days, ending now.
  const int64_t day = 86'400'000, now = Env::Default()->NowMs();
  FakeEnv clock(now - *days * day);
  const int64_t chunk = 10'000, chunks = (*retained + chunk - 1) / chunk;
  const int64_t step = *days * day / std::max<int64_t>(1, chunks);
  Progress bar("retaining markers over " + std::to_string(*days) + " days", *retained);
  auto added = bench::Retain(
      s, consumer, bench::IdKind::kRandom, *retained, static_cast<int>(chunk),
      [&](int64_t done, int64_t) {
        clock.Advance(step);
        bar.Update(done);
      },
      &clock);
  bar.Done();
  if (!added.ok()) return Fail(cmd, added.status());
  const int64_t cutoff = now - (*days - 1) * day;  // the oldest day

  auto inbox_owned = Inbox::Open(s, Inbox::Options{.consumer = "bench-purge-live"});
  if (!inbox_owned.ok()) return Fail(cmd, inbox_owned.status());
  Inbox& inbox = **inbox_owned;
  // The same consumer without purge, for as long as the purge will take (at
  // least a second), as the reference.
  Latencies quiet, during;
  double purge_s = 0;
  int64_t purged = 0;
  {
    std::atomic<bool> stop{false};
    Status cs;
    std::thread t([&] { cs = Consume(inbox, stop, &during); });
    auto t0 = std::chrono::steady_clock::now();
    auto n = s.Purge(consumer, cutoff, static_cast<int>(*batch));
    purge_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stop = true;
    t.join();
    if (!n.ok()) return Fail(cmd, n.status());
    if (!cs.ok()) return Fail(cmd, cs.WithContext("consumer during purge"));
    purged = *n;
  }
  {
    std::atomic<bool> stop{false};
    Status cs;
    std::thread t([&] { cs = Consume(inbox, stop, &quiet); });
    std::this_thread::sleep_for(std::chrono::duration<double>(std::max(1.0, purge_s)));
    stop = true;
    t.join();
    if (!cs.ok()) return Fail(cmd, cs.WithContext("consumer without purge"));
  }
  auto left = s.CountMarkers(consumer);
  if (!left.ok()) return Fail(cmd, left.status());
  (void)bench::PrepareBusinessTable(s);
  const bool ok = purged > 0 && *left + purged == *retained;
  Json j;
  j.Add("bench", "purge")
      .Add("store", std::string(s.Kind()))
      .Add("retained", *retained)
      .Add("days", *days)
      .Add("purge_batch", *batch)
      .Add("purged", purged)
      .Add("left", *left)
      .Add("purge_seconds", purge_s)
      .Add("consumer_calls_during", static_cast<int64_t>(during.ms.size()))
      .Add("consumer_max_ms_during", during.Max())
      .Add("consumer_p99_ms_during", during.P99())
      .Add("consumer_calls_quiet", static_cast<int64_t>(quiet.ms.size()))
      .Add("consumer_max_ms_quiet", quiet.Max())
      .Add("consumer_p99_ms_quiet", quiet.P99())
      .Add("ok", ok);
  if (args.Bool("json")) {
    std::cout << j.str() << "\n";
  } else {
    std::printf(
        "idem bench purge: %lld markers over %lld days; purged the oldest day: %lld markers in %.2f s "
        "(batches of %lld)\n  consumer during purge: %zu calls, p99 %.2f ms, max %.2f ms\n"
        "  consumer without purge: %zu calls, p99 %.2f ms, max %.2f ms\n",
        static_cast<long long>(*retained), static_cast<long long>(*days), static_cast<long long>(purged), purge_s,
        static_cast<long long>(*batch), during.ms.size(), during.P99(), during.Max(), quiet.ms.size(), quiet.P99(),
        quiet.Max());
  }
  return ok ? kExitOk : kExitCheckFailed;
}

}  // namespace idem::cli
