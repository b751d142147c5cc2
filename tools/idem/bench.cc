// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem bench marker: what the marker costs. In one run on one SQLite file it
// measures messages per second of the bare business work and of the same work
// guarded by the marker, side by side (alternating rounds, so both see the
// same machine noise), with N markers already retained, and prints the ratio.
// The workload itself is in bench/marker_workload.h, shared with the Google
// Benchmark target.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "components.h"
#include "idem/inbox.h"
#include "marker_workload.h"
#if IDEM_HAVE_POSTGRES
#include "idem/postgres/store.h"
#endif
#include "idem/sqlite/store.h"
#include "idem/url.h"

namespace idem::cli {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr int kRetainChunk = 10'000;  // markers per transaction while pre-populating
constexpr int kRetainCacheKib = 64 * 1024;
constexpr int64_t kMaxBatch = 1'000'000;

std::string_view SyncName(sqlite::Synchronous s) {
  return s == sqlite::Synchronous::kFull ? "full" : s == sqlite::Synchronous::kNormal ? "normal" : "off";
}

Result<sqlite::Synchronous> ParseSync(const std::string& v) {
  if (v == "full" || v == "FULL") return sqlite::Synchronous::kFull;
  if (v == "normal" || v == "NORMAL") return sqlite::Synchronous::kNormal;
  if (v == "off" || v == "OFF") return sqlite::Synchronous::kOff;
  return Status::InvalidArgument("--synchronous must be full, normal or off, not '" + v + "'");
}

std::string Directory(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

// Overwrites a preallocated 1 MiB file in place, as SQLite reuses its WAL.
Result<double> MeasureFsync(const std::string& dir, double seconds) {
  std::string path = dir + "/.idem-bench-fsync-probe." + std::to_string(::getpid());
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IoError("fsync probe: cannot create " + path + ": " + std::strerror(errno));
  auto fail = [&](const char* what) {
    Status s = Status::IoError(std::string("fsync probe: ") + what + " " + path + ": " + std::strerror(errno));
    ::close(fd);
    ::unlink(path.c_str());
    return s;
  };
  constexpr int kBlock = 4096, kBlocks = 256;
  std::vector<char> buf(kBlock, 'i');
  for (int i = 0; i < kBlocks; ++i)
    if (::write(fd, buf.data(), kBlock) != kBlock) return fail("write");
  if (::fsync(fd) != 0) return fail("fsync");
  int64_t n = 0;
  auto t0 = Clock::now();
  double elapsed = 0;
  do {
    buf[0] = static_cast<char>(n);
    if (::pwrite(fd, buf.data(), kBlock, static_cast<off_t>(n % kBlocks) * kBlock) != kBlock) return fail("write");
    if (::fdatasync(fd) != 0) return fail("fdatasync");
    ++n;
    elapsed = SecondsSince(t0);
  } while (elapsed < seconds);
  ::close(fd);
  ::unlink(path.c_str());
  return static_cast<double>(n) / elapsed;
}

namespace {

using bench::Side;

using bench::ParallelRound;

std::string Grouped(double v) {
  std::string digits = std::to_string(static_cast<int64_t>(std::llround(v)));
  std::string out;
  int k = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
    if (k && k % 3 == 0 && *it != '-') out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++k;
  }
  return out;
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// The process's resident memory now, in MiB (VmRSS), or -1.
double ResidentMiB() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  double kib = -1;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, "VmRSS:", 6) == 0) kib = std::atof(line + 6);
  std::fclose(f);
  return kib < 0 ? -1 : kib / 1024;
}

std::string RatesJson(const std::vector<double>& v) {
  std::vector<std::string> items;
  items.reserve(v.size());
  for (double r : v) items.push_back(std::to_string(std::llround(r)));
  return JsonArray(items);
}

// The marker benchmark's flags, and the SQLite store's options. SQLite:
// --synchronous, else the URL's ?synchronous=, else FULL per message and
// NORMAL for batches. PostgreSQL: the server's own synchronous_commit (on,
// as installed).
struct MarkerSettings {
  int64_t retained = 0, batch = 1, rounds = 1, consumers = 1;
  double seconds = 0;
  bench::IdKind kind = bench::IdKind::kRandom;
  bool by_time = false, json = false, pg = false;
  std::string consumer, url;
  sqlite::Store::Options opts;
};

Result<MarkerSettings> ParseMarkerSettings(const Args& args) {
  MarkerSettings st;
  IDEM_ASSIGN_OR_RETURN(st.retained, args.GetInt("retained", 0, int64_t{1} << 40));
  IDEM_ASSIGN_OR_RETURN(st.batch, args.GetInt("batch", 1, kMaxBatch));
  IDEM_ASSIGN_OR_RETURN(st.rounds, args.GetInt("rounds", 1, 1000));
  IDEM_ASSIGN_OR_RETURN(st.seconds, args.GetDouble("seconds", 0.001, 3600));
  IDEM_ASSIGN_OR_RETURN(st.consumers, args.GetInt("consumers", 1, 64));
  if (std::string ids = args.Get("ids"); ids == "random") {
    st.kind = bench::IdKind::kRandom;
  } else if (ids == "ordered") {
    st.kind = bench::IdKind::kOrdered;
  } else {
    return Status::InvalidArgument("--ids must be random or ordered, not '" + ids + "'");
  }
  st.by_time = args.Bool("key-by-producer-time");
  st.consumer = args.Has("consumer")
                    ? args.Get("consumer")
                    : "bench-" + std::string(bench::IdKindName(st.kind)) + (st.by_time ? "-ptime" : "");
  IDEM_RETURN_IF_ERROR(ValidateId(st.consumer).WithContext("--consumer"));
  st.url = args.Get("store");
  st.pg = IsPostgresScheme(st.url);
#if !IDEM_HAVE_POSTGRES
  if (st.pg) return NotBuilt("the PostgreSQL store", "IDEM_WITH_POSTGRES");
#endif
  if (!st.pg) {
    IDEM_ASSIGN_OR_RETURN(st.opts, sqlite::Store::ParseUrl(st.url));
    if (args.Has("synchronous")) {
      IDEM_ASSIGN_OR_RETURN(st.opts.synchronous, ParseSync(args.Get("synchronous")));
    } else if (st.url.find("synchronous=") == std::string::npos) {
      st.opts.synchronous = st.batch == 1 ? sqlite::Synchronous::kFull : sqlite::Synchronous::kNormal;
    }
  } else if (args.Has("synchronous")) {
    return Status::InvalidArgument("--synchronous is for SQLite; PostgreSQL uses its synchronous_commit");
  }
  st.json = args.Bool("json");
  return st;
}

// The store measured; `loading`: on SQLite a connection tuned for loading
// (no fsync, big cache).
Result<std::unique_ptr<Store>> OpenMarkerStore(const MarkerSettings& st, bool loading) {
#if IDEM_HAVE_POSTGRES
  if (st.pg) return postgres::Store::Open({.url = st.url, .pool_size = static_cast<int>(st.consumers) + 1});
#endif
  sqlite::Store::Options o = st.opts;
  if (loading) {
    o.synchronous = sqlite::Synchronous::kOff;
    o.cache_kib = kRetainCacheKib;
  }
  return sqlite::Store::Open(o);
}

// What the run found besides the two sides' rates.
struct MarkerFacts {
  int64_t added = 0, have = 0, total_markers = 0;
  double retain_s = 0, fsync_per_s = 0, warmup = 0, rss_mib = 0;
  std::string sync, checkpoint, sync_label, where;
};

// Pre-populates the retained markers (on SQLite on a connection tuned for
// loading); the layout is the store's own.
Status RetainMarkers(const MarkerSettings& st, MarkerFacts& f) {
  IDEM_ASSIGN_OR_RETURN(auto store, OpenMarkerStore(st, true));
  IDEM_RETURN_IF_ERROR(bench::PrepareBusinessTable(*store).WithContext("business table"));
  auto t0 = Clock::now();
  std::unique_ptr<Progress> bar;
  auto n = bench::Retain(
      *store, st.consumer, st.kind, st.retained, kRetainChunk,
      [&](int64_t done, int64_t total) {
        if (!bar)
          bar = std::make_unique<Progress>("retaining " + std::string(bench::IdKindName(st.kind)) + " markers", total);
        bar->Update(done);
      },
      nullptr, st.by_time);
  if (bar) bar->Done();
  IDEM_ASSIGN_OR_RETURN(f.added, std::move(n));
  f.retain_s = SecondsSince(t0);
  return Status::OK();
}

// The measured store's markers and durability, and the disk's fdatasync
// rate (per message only).
Status DescribeStore(const MarkerSettings& st, Store& store, MarkerFacts& f) {
  IDEM_ASSIGN_OR_RETURN(f.have, store.CountMarkers(st.consumer));
  IDEM_ASSIGN_OR_RETURN(f.total_markers, store.CountMarkers(""));
  f.sync = st.pg ? "" : std::string(SyncName(st.opts.synchronous));
  if (st.pg) {
    IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
    IDEM_ASSIGN_OR_RETURN(auto r, tx->Query("SHOW synchronous_commit"));
    f.sync = r.rows[0][0].AsText();
  }
  // SQLite: where checkpoints ran (Options::checkpoint, auto resolved).
  f.checkpoint = st.pg ? "" : sqlite::Store::CheckpointsInBackground(st.opts) ? "background" : "inline";
  f.sync_label =
      (st.pg ? "synchronous_commit " : "synchronous ") + f.sync + (st.pg ? "" : ", checkpoints " + f.checkpoint);
  f.where = st.pg ? RedactUrl(st.url) : st.opts.path;
  if (st.batch == 1) {
    // SQLite: the store's own directory. PostgreSQL: the temporary
    // directory, on this machine's one disk (its data directory may not be ours).
    const char* tmp = std::getenv("TMPDIR");
    IDEM_ASSIGN_OR_RETURN(f.fsync_per_s,
                          MeasureFsync(st.pg ? std::string(tmp ? tmp : "/tmp") : Directory(st.opts.path), 1.0));
  }
  return Status::OK();
}

// A short unmeasured warm-up of each side (statements prepared, caches and
// the WAL in their steady state), then the rounds, alternating bare and
// guarded.
Status MeasureSides(const MarkerSettings& st, Store& store, Side& b, Side& g, MarkerFacts& f) {
  IDEM_ASSIGN_OR_RETURN(
      auto inbox, Inbox::Open(store, Inbox::Options{.consumer = st.consumer, .key_by_producer_time = st.by_time}));
  const int nc = static_cast<int>(st.consumers);
  auto bare = [&](std::span<const Message> m) { return bench::BareBatch(store, m); };
  auto guarded = [&](std::span<const Message> m) { return bench::GuardedBatch(*inbox, m); };
  f.warmup = std::min(0.5, st.seconds / 4);
  IDEM_RETURN_IF_ERROR(ParallelRound(st.kind, nc, st.batch, f.warmup, nullptr, bare).WithContext("bare"));
  IDEM_RETURN_IF_ERROR(ParallelRound(st.kind, nc, st.batch, f.warmup, nullptr, guarded).WithContext("guarded"));
  Progress progress("measuring bare and guarded", 2 * st.rounds);
  for (int64_t r = 0; r < st.rounds; ++r) {
    IDEM_RETURN_IF_ERROR(ParallelRound(st.kind, nc, st.batch, st.seconds, &b, bare).WithContext("bare"));
    progress.Update(2 * r + 1);
    IDEM_RETURN_IF_ERROR(ParallelRound(st.kind, nc, st.batch, st.seconds, &g, guarded).WithContext("guarded"));
    progress.Update(2 * r + 2);
  }
  return Status::OK();
}

void PrintMarkerJson(const MarkerSettings& st, const MarkerFacts& f, const Side& b, const Side& g) {
  const double bare_ps = b.PerSecond(), guarded_ps = g.PerSecond();
  const double ratio = guarded_ps > 0 ? bare_ps / guarded_ps : INFINITY;
  Json j;
  j.Add("bench", "marker")
      .Add("store", st.pg ? "postgres" : "sqlite")
      .Add("path", f.where)
      .Add("consumers", static_cast<int>(st.consumers))
      .Add("consumer", st.consumer)
      .Add("ids", std::string(bench::IdKindName(st.kind)))
      .Add("key_by_producer_time", st.by_time)
      .Add("retained", f.have)
      .Add("retained_requested", st.retained)
      .Add("retained_added", f.added)
      .Add("retain_seconds", f.retain_s)
      .Add("markers_in_store", f.total_markers)
      .Add("batch", st.batch)
      .Add("synchronous", f.sync);
  if (!st.pg) j.Add("checkpoint", f.checkpoint);
  j.Add("seconds", st.seconds)
      .Add("rounds", st.rounds)
      .Add("warmup_seconds", f.warmup)
      .Add("bare_messages", b.messages)
      .Add("bare_seconds", b.seconds)
      .Add("bare_per_s", static_cast<int64_t>(std::llround(bare_ps)))
      .AddRaw("bare_rounds_per_s", RatesJson(b.rounds))
      .Add("guarded_messages", g.messages)
      .Add("guarded_seconds", g.seconds)
      .Add("guarded_per_s", static_cast<int64_t>(std::llround(guarded_ps)))
      .AddRaw("guarded_rounds_per_s", RatesJson(g.rounds))
      .Add("ratio", ratio)
      .Add("rss_mib", f.rss_mib);
  if (st.batch == 1) {
    j.Add("fsync_per_s", static_cast<int64_t>(std::llround(f.fsync_per_s)))
        .Add("bare_per_fsync", bare_ps / f.fsync_per_s)
        .Add("guarded_per_fsync", guarded_ps / f.fsync_per_s);
  }
  std::cout << j.str() << "\n";
}

void PrintMarkerText(const MarkerSettings& st, const MarkerFacts& f, const Side& b, const Side& g) {
  const double bare_ps = b.PerSecond(), guarded_ps = g.PerSecond();
  const double ratio = guarded_ps > 0 ? bare_ps / guarded_ps : INFINITY;
  std::cout << "idem bench marker: " << f.where << " (" << (st.pg ? "postgres" : "sqlite") << "), consumer "
            << st.consumer << ", " << st.consumers << " consumer thread(s)\n"
            << "  " << Grouped(static_cast<double>(f.have)) << " retained " << bench::IdKindName(st.kind)
            << " markers ("
            << (f.added == 0 ? std::string("file reused")
                             : "added " + Grouped(static_cast<double>(f.added)) + " in " + Fixed(f.retain_s, 1) + " s")
            << "), batch " << st.batch << (st.batch == 1 ? " (Inbox::Handle)" : " (Inbox::HandleBatch)") << ", "
            << f.sync_label << "\n"
            << "  " << st.rounds << " round(s) of " << Fixed(st.seconds, 2) << " s per side, alternating\n";
  if (f.total_markers > f.have)
    std::cout << "  note: the store holds " << Grouped(static_cast<double>(f.total_markers))
              << " markers in all (other consumers share the table)\n";
  for (size_t r = 0; r < b.rounds.size(); ++r)
    std::cout << "  round " << r + 1 << ": bare " << Grouped(b.rounds[r]) << "/s, guarded " << Grouped(g.rounds[r])
              << "/s\n";
  std::printf("  bare     %12s msg/s  (%s messages in %.2f s)\n", Grouped(bare_ps).c_str(),
              Grouped(static_cast<double>(b.messages)).c_str(), b.seconds);
  std::printf("  guarded  %12s msg/s  (%s messages in %.2f s)\n", Grouped(guarded_ps).c_str(),
              Grouped(static_cast<double>(g.messages)).c_str(), g.seconds);
  std::printf("  ratio bare/guarded: %.1fx\n", ratio);
  std::printf("  resident memory after measuring: %.1f MiB\n", f.rss_mib);
  if (st.batch == 1)
    std::printf("  disk: %s fdatasync/s (4 KiB); bare %.2f, guarded %.2f messages per fdatasync\n",
                Grouped(f.fsync_per_s).c_str(), bare_ps / f.fsync_per_s, guarded_ps / f.fsync_per_s);
  std::fflush(stdout);
}

int RunMarker(const Args& args) {
  const std::string cmd = "bench marker";
  auto settings = ParseMarkerSettings(args);
  if (!settings.ok()) return Fail(cmd, settings.status());
  const MarkerSettings& st = *settings;
  MarkerFacts f;
  if (Status s = RetainMarkers(st, f); !s.ok()) return Fail(cmd, s);
  // The measured store, with the durability under test.
  auto store_or = OpenMarkerStore(st, false);
  if (!store_or.ok()) return Fail(cmd, store_or.status());
  Store& store = **store_or;
  if (Status s = DescribeStore(st, store, f); !s.ok()) return Fail(cmd, s);
  Side b, g;
  if (Status s = MeasureSides(st, store, b, g, f); !s.ok()) return Fail(cmd, s);
  // Resident memory of the measuring process with N markers retained (the
  // loading connection, with its big cache, is closed by now).
  f.rss_mib = ResidentMiB();
  // Leave the business table empty: a later run starts from the same file.
  if (Status s = bench::PrepareBusinessTable(store); !s.ok()) return Fail(cmd, s.WithContext("business table"));
  if (st.json) {
    PrintMarkerJson(st, f, b, g);
  } else {
    PrintMarkerText(st, f, b, g);
  }
  return kExitOk;
}

}  // namespace

const Command& BenchCommand() {
  static const Command c{
      "bench",
      "Measure what exactly-once costs.\n\n"
      "  marker   messages per second of the bare business work (an INSERT per message, in its own\n"
      "           transactions) and of the same work guarded by the marker (Inbox::Handle per message,\n"
      "           Inbox::HandleBatch for batches), side by side in one run on one store, with N\n"
      "           markers already retained; prints the ratio bare/guarded. Rounds alternate (bare,\n"
      "           guarded, bare, ...) so both sides see the same machine noise; every message has a\n"
      "           fresh id. Per message (--batch 1) it also measures the disk's fdatasync rate.\n"
      "           On PostgreSQL (--store postgres://...) the same, with --consumers threads at once.\n"
      "           The retained markers are written once with the real layout and reused by later runs\n"
      "           on the same file; the business table bench_payments is emptied after each run.\n\n"
      "  peers    idem on the workload of the peer libraries in ../shared/peers (N unique messages,\n"
      "           each delivered DUP times, CONCURRENCY in flight, one payments row each; N, DUP and\n"
      "           CONCURRENCY from the environment or --n/--dup/--concurrency), printing their result\n"
      "           line. --store defaults to PostgreSQL from the PG* environment. See bench/peers/.\n\n"
      "  purge    N markers (--retained) spread over --days days; purges the oldest day while a consumer\n"
      "           keeps handling messages, and reports the purge time and the consumer's p99 and worst\n"
      "           call next to the same consumer without purge.\n\n"
      "  claims   the two-phase mode (Claims) on the Powertools peer's workload: --n unique keys, each\n"
      "           called --dup times, --concurrency in flight (one thread each; with --batch B, concurrency/B\n"
      "           threads each claiming B keys at once with ClaimMany and completing them with CompleteMany);\n"
      "           the first call of a key claims it, runs the\n"
      "           work (a counter) and completes it, later calls replay the stored result. Prints the peers'\n"
      "           result line with claims/s (pass 1) and replays/s (later passes). --store sqlite:PATH,\n"
      "           postgres://... or redis://... See bench/peers/claims-vs-powertools.sh.\n\n"
      "  source   what the guard and the store cost on top of a broker: rounds alternate between the\n"
      "           broker's own consume-and-ack rate (no database) and the Consumer with the Inbox on\n"
      "           --store, each on freshly published --messages (of which --dup-rate published twice);\n"
      "           prints raw_per_s, guarded_per_s and the ratio.\n\n"
      "  call-first  a consumer whose provider takes --provider-delay-ms per charge, with each worker count\n"
      "           of --workers-list in one run: rounds alternate the counts and the forms. The provider is\n"
      "           `idem provider`'s server (two-phase Idempotency-Key handling, a sleep per first execution\n"
      "           of POST /charges) in this process on 127.0.0.1; --messages fresh messages per round, each\n"
      "           published twice, on an embedded queue in a work directory beside the store. Forms:\n"
      "           call-first (idem::CallFirst: calls.Once(\"charge\", POST /charges) before the Inbox's\n"
      "           transaction, then the payment row in it; claims in the store) and in-transaction (CallOnce\n"
      "           inside a plain Handler; on SQLite its claims in a file of their own). Prints messages/s\n"
      "           per worker count and round, the ratio of each count to the first per round and the\n"
      "           median; checks every message applied once and the provider charged once per order\n"
      "           (exit 1 if not).\n\n"
      "  outbox-add  what Outbox::Add costs in the handler's transaction: rounds alternate between the\n"
      "           work (Inbox::Handle, or HandleBatch for --batch B, default 100: a marker and a payments row\n"
      "           per message) and the same work plus one Outbox::Add per message; prints both rates and the\n"
      "           ratio work+outbox time / work time. SQLite runs with synchronous FULL. The added messages\n"
      "           are published away to a throwaway embedded queue at the end.\n\n"
      "  relay    the outbox relay's throughput: preloads --messages over --keys ordering keys (transactions\n"
      "           of 100), starts --relays relays (threads, each its own OutboxRelay) publishing to --to, and\n"
      "           times until a consumer of that destination (Receive and Ack) has seen every id; checks every\n"
      "           id arrived and each key's first copies came in idem-outbox-seq order (exit 1 if not). --to\n"
      "           without a queue, stream or topic: one of the run's own. With --rate R a producer adds R\n"
      "           messages/s while one relay runs, and prints the latency commit -> receipt (p50/p99/p999).\n\n"
      "  observer what an observer costs: rounds alternate between the Inbox's work (a marker and a\n"
      "           payments row per message; --batch B, default 1) without an observer and with\n"
      "           idem::Metrics; prints both rates and the ratio without/with.\n\n"
      "  webhooks verified webhooks per second, first deliveries and replays, of two receivers served side\n"
      "           by side on 127.0.0.1: idem's WebhookReceiver (the marker and the event's row in one\n"
      "           transaction on --store, --group-commit G) and the hand-rolled design (the same signature\n"
      "           check, Redis SET NX EX on --redis, the event's row in its own transaction on --store).\n"
      "           --concurrency senders, --messages fresh events per round and side (default 2000), then\n"
      "           the same deliveries again; rounds alternate which side goes first. Prints both rates and\n"
      "           the ratios idem/redis; checks every answer 200 and one row per event (exit 1 if not).\n\n"
      "  pooler   PostgreSQL through a transaction pooler (--pooled, e.g. pgbouncer pool_mode=transaction)\n"
      "           beside the same server reached directly (--direct), rounds alternating the sides: the\n"
      "           inbox per message (Inbox::Handle, --consumers threads, default 4, --seconds per side and\n"
      "           round) and HTTP first executions of `idem provider`'s POST /charges in one transaction\n"
      "           with group commit (--group-commit, default 64; --committers 1, --fibers 1; --requests\n"
      "           fresh keys, default 20000, from --connections keep-alive connections, default 16), after\n"
      "           a warm-up round. Prints each round's rates and the median ratio pooled/direct per workload\n"
      "           (issue 34's target: >= 0.8). --unnamed adds the direct URL with ?idem_pooler=transaction\n"
      "           (unnamed statements, no pooler). Checks every request answered 201 and one charge per key\n"
      "           (exit 1 if not).\n\n"
      "  gateway  what idem::httplib::Gateway adds to a request, in this process: an upstream on 127.0.0.1\n"
      "           answering POST with 201 after --upstream-delay-ms (default 5), the gateway in front of it on\n"
      "           --store (default: a SQLite file in a temporary directory, fsync on), keep-alive clients sending\n"
      "           straight to the upstream (direct) or through the gateway, rounds alternating the sides: first\n"
      "           executions (a fresh Idempotency-Key each) and replays (the round's keys again; direct: the\n"
      "           upstream answers a key it has seen at once, without its delay). Latency with one client per\n"
      "           side, requests alternating between the sides one by one (--latency-requests per mode and round,\n"
      "           default 300): p50/p99 and the added latency gateway - direct; throughput with --clients\n"
      "           (default 64; --requests per mode and round, default 2000): the median ratio gateway/direct\n"
      "           (--rounds, default 3, after a warm-up); first executions also go through the gateway on a\n"
      "           path it does not guard, to show the hop alone (pass/direct) and the store's part\n"
      "           (gateway/pass). Prints issue 37's targets met or not; checks every answer 201, one upstream\n"
      "           call per gateway first execution and per unguarded one, none per replay (exit 1 if not).",
      "marker --store sqlite:PATH|postgres://... [--retained N] [--ids random|ordered] [--batch B] [--consumers C] "
      "[--json]\n"
      "       idem bench peers [--store URL] [--batch B] [--n N] [--dup D] [--concurrency C]\n"
      "       idem bench purge --store URL [--retained N] [--days D] [--purge-batch B] [--json]\n"
      "       idem bench claims --store URL [--n N] [--dup D] [--concurrency C] [--batch B]\n"
      "       idem bench source --source URL --store URL [--messages N] [--dup-rate R] [--workers W] [--batch B] "
      "[--rounds R]\n"
      "       idem bench call-first --store sqlite:PATH|postgres://... [--messages N] [--provider-delay-ms MS]\n"
      "            [--workers-list 1,4] [--rounds R] [--forms both|call-first|in-transaction] [--json]\n"
      "       idem bench outbox-add --store URL [--batch B] [--seconds S] [--rounds R] [--keys K] [--json]\n"
      "       idem bench relay --store URL --to URL [--messages N] [--keys K] [--payload-bytes B] [--relays R]\n"
      "            [--rate R] [--batch B] [--json]\n"
      "       idem bench observer --store URL [--batch B] [--seconds S] [--rounds R] [--json]\n"
      "       idem bench webhooks --store URL --redis redis://HOST:PORT [--messages N] [--concurrency C]\n"
      "            [--group-commit G] [--rounds R] [--json]\n"
      "       idem bench pooler --direct URL --pooled URL [--workloads inbox,http|inbox|http] [--consumers C]\n"
      "            [--seconds S] [--requests N] [--connections C] [--group-commit G] [--committers C] [--fibers F]\n"
      "            [--ids random|ordered] [--rounds R] [--unnamed] [--json]\n"
      "       idem bench gateway [--store URL] [--clients C] [--upstream-delay-ms MS] [--requests N]\n"
      "            [--latency-requests N] [--rounds R] [--json]",
      {{"store", "URL", "sqlite:idem-bench.db", "the store (sqlite:PATH, its directory must exist; or postgres://...)"},
       {"consumers", "C", "1", "threads measuring at once, each with its own connection"},
       {"retained", "N", "1000000", "markers already retained by the consumer before measuring"},
       {"ids", "KIND", "random", "message ids: random (UUIDv4-like) or ordered (time-ordered, UUIDv7-like)"},
       {"batch", "B", "1",
        "messages per transaction (1: Inbox::Handle, more: Inbox::HandleBatch; outbox-add: default 100);\n"
        "          relay: rows per relay round (default 500)"},
       {"synchronous", "MODE", "", "full, normal or off (default: full for --batch 1, normal for batches)"},
       {"seconds", "S", "2", "time per measured round and side"},
       {"rounds", "R", "3", "measured rounds per side (call-first: rounds of every worker count and form)"},
       {"consumer", "NAME", "bench-<ids>", "the consumer whose markers are retained and measured"},
       {"key-by-producer-time", "", "", "marker: key markers by the messages' producer time (Inbox::Options)"},
       {"json", "", "", "print one JSON object"},
       {"n", "N", "", "peers: unique messages (default: $N or 20000)"},
       {"dup", "D", "", "peers: deliveries of each (default: $DUP or 2)"},
       {"concurrency", "C", "", "peers: deliveries in flight (default: $CONCURRENCY or 16)"},
       {"days", "D", "10", "purge: the retained markers' processing times span D days; the oldest is purged"},
       {"purge-batch", "B", "2000", "purge: markers per purge transaction"},
       {"source", "URL", "", "source: the broker (see idem run --help)"},
       {"messages", "N", "",
        "source: distinct messages per round (default 10000); call-first: per round and\n"
        "          worker count (default 400)"},
       {"dup-rate", "R", "", "source: fraction published twice (default 0)"},
       {"workers", "W", "", "source: consumer threads (default 4)"},
       {"provider-delay-ms", "MS", "20", "call-first: how long the provider works on each charge"},
       {"workers-list", "W,W", "1,4", "call-first: the worker counts compared (ratios to the first)"},
       {"forms", "F", "both", "call-first: both, call-first or in-transaction"},
       {"to", "URL", "", "relay: the relay's destination (a source URL; see idem run --help)"},
       {"keys", "K", "",
        "relay: ordering keys (default 100); outbox-add: keys of the added messages\n"
        "          (default 0: each its own, the message id)"},
       {"payload-bytes", "B", "100", "relay: payload size of each message"},
       {"relays", "R", "1", "relay: relays at once, each its own OutboxRelay, store and publisher"},
       {"rate", "R", "", "relay: add R messages/s while one relay runs and measure commit -> receipt latency"},
       {"redis", "URL", "", "webhooks: the hand-rolled receiver's Redis (redis://HOST:PORT)"},
       {"group-commit", "G", "16",
        "webhooks: idem's receiver's group commit (0: a transaction per event);\n"
        "          pooler: the provider's (default 64)"},
       {"direct", "URL", "", "pooler: the PostgreSQL server, reached directly"},
       {"pooled", "URL", "", "pooler: the same server through the transaction pooler"},
       {"workloads", "W", "inbox,http", "pooler: inbox, http or both"},
       {"requests", "N", "20000",
        "pooler: fresh keys per side and round (http); gateway: requests per mode and\n"
        "          round with --clients (default 2000)"},
       {"connections", "C", "16", "pooler: keep-alive connections sending them"},
       {"committers", "C", "1", "pooler: the provider's group committers"},
       {"fibers", "F", "1", "pooler: the provider's fiber threads (0: a thread per request)"},
       {"unnamed", "", "", "pooler: a third side, --direct with ?idem_pooler=transaction"},
       {"clients", "C", "64", "gateway: keep-alive clients at once for throughput"},
       {"upstream-delay-ms", "MS", "5", "gateway: how long the upstream works on a first execution"},
       {"latency-requests", "N", "300", "gateway: requests per mode and round with one client"}},
      /*max_positional=*/1};
  return c;
}

int RunBench(const Args& args) {
  const auto& pos = args.positional();
  if (pos.empty())
    return Fail("bench",
                Status::InvalidArgument(
                    "missing subcommand: expected marker, peers, purge, claims, source, call-first, outbox-add, relay, "
                    "observer, webhooks, pooler or gateway (see idem bench --help)"));
  if (pos[0] != "marker" && pos[0] != "peers" && pos[0] != "purge" && pos[0] != "claims" && pos[0] != "source" &&
      pos[0] != "call-first" && pos[0] != "outbox-add" && pos[0] != "relay" && pos[0] != "observer" &&
      pos[0] != "webhooks" && pos[0] != "pooler" && pos[0] != "gateway")
    return Fail("bench", Status::InvalidArgument("unknown subcommand '" + pos[0] +
                                                 "': expected marker, peers, purge, claims, source, call-first, "
                                                 "outbox-add, relay, observer, webhooks, pooler or gateway (see idem "
                                                 "bench --help)"));
  if (pos.size() > 1) return Fail("bench " + pos[0], Status::InvalidArgument("unexpected argument '" + pos[1] + "'"));
  if (pos[0] == "purge") return RunBenchPurge(args);
  if (pos[0] == "claims") return RunBenchClaims(args);
  if (pos[0] == "source") return RunBenchSource(args);
  if (pos[0] == "outbox-add" || pos[0] == "relay" || pos[0] == "observer") return RunBenchOutbox(args);
#if IDEM_HAVE_HTTP && IDEM_HAVE_REDIS
  if (pos[0] == "webhooks") return RunBenchWebhooks(args);
#else
  if (pos[0] == "webhooks")  // served over HTTP, beside a Redis SET NX receiver
    return Fail("bench webhooks",
                NotBuilt("idem bench webhooks", "IDEM_WITH_HTTP=ON -DIDEM_WITH_HTTPLIB=ON -DIDEM_WITH_REDIS"));
#endif
#if IDEM_HAVE_HTTP
  if (pos[0] == "call-first") return RunBenchCallFirst(args);
  if (pos[0] == "pooler") return RunBenchPooler(args);
  if (pos[0] == "gateway") return RunBenchGateway(args);
#else
  if (pos[0] == "gateway")  // the gateway is the cpp-httplib adapter's
    return Fail("bench gateway", NotBuilt("idem bench gateway", "IDEM_WITH_HTTP=ON -DIDEM_WITH_HTTPLIB"));
  if (pos[0] == "pooler")  // its second workload is the provider, served over HTTP
    return Fail("bench pooler", NotBuilt("idem bench pooler", "IDEM_WITH_HTTP=ON -DIDEM_WITH_HTTPLIB"));
  if (pos[0] == "call-first")  // its provider is served over HTTP
    return Fail("bench call-first", NotBuilt("idem bench call-first", "IDEM_WITH_HTTP=ON -DIDEM_WITH_HTTPLIB"));
#endif
  return pos[0] == "marker" ? RunMarker(args) : RunBenchPeers(args);
}

}  // namespace idem::cli
