// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem_marker_benchmark: the marker's cost under Google Benchmark. One
// iteration is one transaction of kBatch messages with fresh random ids over a
// temporary SQLite file (synchronous NORMAL) that already retains
// --idem_retained markers (default 100,000) of the same consumer:
//
//   BM_BareWork     the business INSERTs alone, in their own transaction
//   BM_GuardedWork  the same INSERTs as the handler of Inbox::HandleBatch
//
// items_per_second is messages per second (wall time). The workload is the
// one `idem bench marker` runs (bench/marker_workload.h); that command gives
// the side-by-side figures and the ratio, this target the per-iteration view.
//
//   idem_marker_benchmark [--idem_retained=N] [--benchmark_... flags]
#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "marker_workload.h"

namespace {

constexpr int kBatch = 100;
constexpr const char* kConsumer = "bench-random";
int64_t g_retained = 100'000;

struct Fixture {
  std::string dir, path;
  std::unique_ptr<idem::Store> store;
  std::unique_ptr<idem::Inbox> inbox;
  std::unique_ptr<idem::bench::IdGenerator> ids;
  std::vector<idem::Message> batch;
  idem::Status status;  // why setup failed, if it did
  int64_t retained = 0;

  ~Fixture() {
    inbox.reset();
    store.reset();
    if (path.empty()) return;
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) ::unlink((path + suffix).c_str());
    ::rmdir(dir.c_str());
  }
};

std::unique_ptr<Fixture> g_fixture;

// Built on first use, so `--benchmark_list_tests` costs nothing.
Fixture& GetFixture() {
  if (g_fixture) return *g_fixture;
  g_fixture = std::make_unique<Fixture>();
  Fixture& f = *g_fixture;
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/idem-marker-bench-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    f.status = idem::Status::IoError("mkdtemp " + templ + ": " + std::strerror(errno));
    return f;
  }
  f.dir = buf.data();
  f.path = f.dir + "/marker.db";

  // Load the retained markers without fsync, then reopen with NORMAL.
  {
    auto load = idem::sqlite::Store::Open(
        {.path = f.path, .synchronous = idem::sqlite::Synchronous::kOff, .cache_kib = 64 * 1024});
    if (!load.ok()) {
      f.status = load.status();
      return f;
    }
    if (f.status = idem::bench::PrepareBusinessTable(**load); !f.status.ok()) return f;
    auto added = idem::bench::Retain(**load, kConsumer, idem::bench::IdKind::kRandom, g_retained, 10'000);
    if (!added.ok()) {
      f.status = added.status();
      return f;
    }
  }
  auto store = idem::sqlite::Store::Open({.path = f.path, .synchronous = idem::sqlite::Synchronous::kNormal});
  if (!store.ok()) {
    f.status = store.status();
    return f;
  }
  f.store = std::move(*store);
  auto count = f.store->CountMarkers(kConsumer);
  if (!count.ok()) {
    f.status = count.status();
    return f;
  }
  f.retained = *count;
  auto inbox = idem::Inbox::Open(*f.store, idem::Inbox::Options{.consumer = kConsumer});
  if (!inbox.ok()) {
    f.status = inbox.status();
    return f;
  }
  f.inbox = std::move(*inbox);
  f.ids = std::make_unique<idem::bench::IdGenerator>(idem::bench::IdKind::kRandom, idem::bench::FreshSeed());
  return f;
}

template <typename Run>
void RunBatches(benchmark::State& state, Run&& run) {
  Fixture& f = GetFixture();
  if (!f.status.ok()) {
    state.SkipWithError(("setup: " + f.status.ToString()).c_str());
    return;
  }
  for (auto _ : state) {
    idem::bench::NextBatch(*f.ids, f.batch, kBatch);
    if (idem::Status s = run(f, std::span<const idem::Message>(f.batch)); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["batch"] = kBatch;
  state.counters["retained"] = static_cast<double>(f.retained);
}

void BM_BareWork(benchmark::State& state) {
  RunBatches(state, [](Fixture& f, std::span<const idem::Message> b) { return idem::bench::BareBatch(*f.store, b); });
}

void BM_GuardedWork(benchmark::State& state) {
  RunBatches(state,
             [](Fixture& f, std::span<const idem::Message> b) { return idem::bench::GuardedBatch(*f.inbox, b); });
}

BENCHMARK(BM_BareWork)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_GuardedWork)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  // Our own flag first; the rest goes to Google Benchmark.
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strncmp(argv[i], "--idem_retained=", 16) == 0) {
      char* end = nullptr;
      long long n = std::strtoll(argv[i] + 16, &end, 10);
      if (*end != '\0' || n < 0) {
        std::fprintf(stderr, "idem_marker_benchmark: --idem_retained needs a count >= 0, not '%s'\n", argv[i] + 16);
        return 2;
      }
      g_retained = n;
      continue;
    }
    rest.push_back(argv[i]);
  }
  int n = static_cast<int>(rest.size());
  rest.push_back(nullptr);
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 2;
  benchmark::AddCustomContext("idem.retained_requested", std::to_string(g_retained));
  benchmark::AddCustomContext("idem.synchronous", "NORMAL");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_fixture.reset();  // removes the temporary database
  return 0;
}
