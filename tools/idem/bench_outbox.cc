// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem bench outbox-add: what Outbox::Add costs inside the handler's
// transaction. In one run on one store, rounds alternate between the work of
// an Inbox handler (a marker and a payments row per message, --batch
// messages per transaction: Inbox::Handle or HandleBatch) and the same work
// plus one Outbox::Add per message; prints both rates and the ratio
// work+outbox time / work time. SQLite runs with synchronous FULL.
//
// idem bench relay: the relay's throughput. Preloads --messages over --keys
// ordering keys (transactions of 100), then starts --relays OutboxRelays
// (threads, each its own store and publisher) and times until a consumer on
// the destination (a raw Receive + Ack loop) has seen every id; checks that
// every id arrived and that the first copies of each key came in
// idem-outbox-seq order. With --rate, a producer adds at that rate while one
// relay runs, and the latency from each commit to its first receipt (steady
// clock, one process) is reported as p50/p99/p999.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "components.h"
#include "idem/inbox.h"
#include "idem/metrics.h"
#if IDEM_HAVE_HTTP
#include "live/feed.h"
#endif
#include "idem/open.h"
#include "idem/outbox.h"
#include "idem/outbox_relay.h"
#include "idem/outbox_store.h"
#include "idem/url.h"
#include "marker_workload.h"
#include "sources.h"

namespace idem::cli {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int64_t NanosOf(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// `url` with `key=value` appended to its query unless it has the key.
std::string WithKey(const std::string& url, const std::string& key, const std::string& value) {
  auto parsed = ParseUrl(url, "URL",
                         UrlScheme(url) == "embedded" || UrlScheme(url) == "kafka-mock" || UrlScheme(url) == "sqlite"
                             ? UrlForm::kFile
                             : UrlForm::kNetwork);
  if (parsed.ok() && parsed->Has(key)) return url;
  return url + (url.find('?') == std::string::npos ? "?" : "&") + key + "=" + value;
}

// Publishes whatever the outbox of `store` holds onto a throwaway embedded
// queue and deletes it: the bench's own leftovers never reach a later run.
Status DrainOutbox(Store& store) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::temp_directory_path(ec) / ("idem-bench-drain-" + std::to_string(::getpid()));
  fs::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create " + dir.string() + ": " + ec.message());
  Status result = [&]() -> Status {
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<Publisher> pub,
                          OpenPublisher("embedded:" + (dir / "drain.q").string() + "?durable=false"));
    IDEM_ASSIGN_OR_RETURN(
        std::unique_ptr<OutboxRelay> relay,
        OutboxRelay::Open(store, *pub,
                          {.name = "bench-drain", .poll_ms = 50, .keep_sent = false, .stop_when_idle = true}));
    return relay->Run();
  }();
  fs::remove_all(dir, ec);
  return result.WithContext("draining the outbox");
}

// --- idem bench outbox-add

using bench::Side;

// Batches of fresh messages through `run` for about `seconds`.
template <typename Run>
Status Measure(bench::IdGenerator& ids, size_t batch, double seconds, Side* side, Run&& run) {
  std::vector<Message> msgs;
  return bench::Round(ids, msgs, static_cast<int64_t>(batch), seconds, side, run);
}

int RunOutboxAdd(const Args& args) {
  const std::string cmd = "bench outbox-add";
  auto batch = args.Has("batch") ? args.GetInt("batch", 1, 10'000) : Result<int64_t>(100);
  auto rounds = args.GetInt("rounds", 1, 1000);
  auto keys = args.Has("keys") ? args.GetInt("keys", 0, int64_t{1} << 40) : Result<int64_t>(0);
  for (const auto* r : {&batch, &rounds, &keys})
    if (!r->ok()) return Fail(cmd, r->status());
  auto seconds = args.GetDouble("seconds", 0.001, 3600);
  if (!seconds.ok()) return Fail(cmd, seconds.status());
  std::string url = args.Get("store");
  const bool pg = IsPostgresScheme(url);
  if (!pg) url = WithKey(url, "synchronous", "full");
  auto store_or = OpenStore(url, true, 2);
  if (!store_or.ok()) return Fail(cmd, store_or.status());
  Store& store = **store_or;
  std::string sync = "synchronous full";
  if (pg) {
    auto tx = store.Begin();
    if (!tx.ok()) return Fail(cmd, tx.status());
    auto r = (*tx)->Query("SELECT current_setting('fsync'), current_setting('synchronous_commit')");
    if (!r.ok()) return Fail(cmd, r.status());
    sync = "fsync " + r->rows[0][0].AsText() + ", synchronous_commit " + r->rows[0][1].AsText();
  }
  if (Status s = bench::PrepareBusinessTable(store); !s.ok()) return Fail(cmd, s.WithContext("business table"));
  auto inbox_owned = Inbox::Open(store, Inbox::Options{.consumer = "bench-outbox-add"});
  if (!inbox_owned.ok()) return Fail(cmd, inbox_owned.status());
  Inbox& inbox = **inbox_owned;
  auto outbox_owned = Outbox::Open(store);
  if (!outbox_owned.ok()) return Fail(cmd, outbox_owned.status());
  Outbox& outbox = **outbox_owned;

  // The work: Inbox::Handle / HandleBatch with the payments row. With the
  // outbox: the same handler adds "order paid", keyed by the order (the
  // message id, or one of --keys), to the relay's own channel.
  int64_t added = 0;
  const Handler with_outbox = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(bench::PaymentWork(tx, m));
    OutgoingMessage out{.key = *keys == 0 ? m.id : "order-" + std::to_string(added++ % *keys),
                        .payload = "paid:" + m.payload};
    return outbox.Add(tx, out).status();
  };
  // By hand: the same row, inserted by the handler's own INSERT into a
  // table shaped like idem_outbox (what the storage alone costs).
  const char* hand_ddl =
      pg ? "CREATE TABLE IF NOT EXISTS bench_outbox_by_hand(seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
           " lane smallint NOT NULL, id bytea NOT NULL, destination text NOT NULL, ordering_key bytea NOT NULL,"
           " payload bytea NOT NULL, headers bytea NOT NULL, producer_time_ms bigint NOT NULL,"
           " added_at_ms bigint NOT NULL, attempts integer NOT NULL DEFAULT 0, last_error text)"
         : "CREATE TABLE IF NOT EXISTS bench_outbox_by_hand(seq INTEGER PRIMARY KEY, lane INTEGER NOT NULL,"
           " id BLOB NOT NULL, destination TEXT NOT NULL, ordering_key BLOB NOT NULL, payload BLOB NOT NULL,"
           " headers BLOB NOT NULL, producer_time_ms INTEGER NOT NULL, added_at_ms INTEGER NOT NULL,"
           " attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT)";
  auto by_hand_table = [&](const char* sql) -> Status {
    IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
    IDEM_RETURN_IF_ERROR(tx->Exec(sql).status());
    return tx->Commit();
  };
  if (Status t = by_hand_table(hand_ddl); !t.ok()) return Fail(cmd, t.WithContext("bench_outbox_by_hand"));
  const Handler with_row_by_hand = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(bench::PaymentWork(tx, m));
    const int64_t now = Env::Default()->NowMs();
    const std::string key = *keys == 0 ? m.id : "order-" + std::to_string(added++ % *keys);
    Value row[] = {int64_t{0}, Blob{m.id + "-out"}, std::string(), Blob{key}, Blob{"paid:" + m.payload}, Blob{}, now,
                   now};
    return tx
        .Exec(
            "INSERT INTO bench_outbox_by_hand(lane, id, destination, ordering_key, payload, headers,"
            " producer_time_ms, added_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            row)
        .status();
  };
  auto work = [&](std::span<const Message> b) { return bench::GuardedBatch(inbox, b); };
  auto handled = [&](const Handler& h) {
    return [&inbox, &h](std::span<const Message> b) -> Status {
      if (b.size() == 1) return bench::CheckApplied(inbox.Handle(b[0], h), b[0]);
      std::vector<Outcome> out = inbox.HandleBatch(b, h);
      for (size_t i = 0; i < out.size(); ++i) IDEM_RETURN_IF_ERROR(bench::CheckApplied(out[i], b[i]));
      return Status::OK();
    };
  };
  auto work_hand = handled(with_row_by_hand);
  auto work_outbox = handled(with_outbox);

  bench::IdGenerator ids(bench::IdKind::kOrdered, bench::FreshSeed());
  const size_t nb = static_cast<size_t>(*batch);
  const double warmup = std::min(0.5, *seconds / 4);
  Side w, o, h;
  Status s = Measure(ids, nb, warmup, nullptr, work);
  if (s.ok()) s = Measure(ids, nb, warmup, nullptr, work_outbox);
  if (s.ok()) s = Measure(ids, nb, warmup, nullptr, work_hand);
  {
    Progress progress("measuring work, work+outbox and work+row by hand", 3 * *rounds);
    for (int64_t r = 0; s.ok() && r < *rounds; ++r) {
      s = Measure(ids, nb, *seconds, &w, work);
      progress.Update(3 * r + 1);
      if (s.ok()) s = Measure(ids, nb, *seconds, &o, work_outbox);
      progress.Update(3 * r + 2);
      if (s.ok()) s = Measure(ids, nb, *seconds, &h, work_hand);
      progress.Update(3 * r + 3);
    }
  }
  if (Status t = by_hand_table("DROP TABLE IF EXISTS bench_outbox_by_hand"); s.ok() && !t.ok()) s = t;
  if (!s.ok()) return Fail(cmd, s);
  // Leave the store as found: payments emptied, the outbox published away.
  if (Status c = bench::PrepareBusinessTable(store); !c.ok()) return Fail(cmd, c.WithContext("business table"));
  if (Status d = DrainOutbox(store); !d.ok()) return Fail(cmd, d);

  const double work_ps = w.PerSecond(), outbox_ps = o.PerSecond(), hand_ps = h.PerSecond();
  const double ratio = outbox_ps > 0 ? work_ps / outbox_ps : INFINITY;
  const double hand_ratio = hand_ps > 0 ? work_ps / hand_ps : INFINITY;
  const std::string kind(store.Kind());
  for (size_t r = 0; r < w.rounds.size(); ++r)
    std::printf("round %zu: work %.0f/s, work+outbox %.0f/s, work+row by hand %.0f/s\n", r + 1, w.rounds[r],
                o.rounds[r], h.rounds[r]);
  std::printf(
      "bench=outbox-add store=%s batch=%lld keys=%lld work_per_s=%.1f outbox_per_s=%.1f ratio=%.3f by_hand_per_s=%.1f"
      " by_hand_ratio=%.3f (%s)\n",
      kind.c_str(), static_cast<long long>(*batch), static_cast<long long>(*keys), work_ps, outbox_ps, ratio, hand_ps,
      hand_ratio, sync.c_str());
  if (args.Bool("json")) {
    Json j;
    j.Add("bench", "outbox-add")
        .Add("store", kind)
        .Add("durability", sync)
        .Add("batch", *batch)
        .Add("keys", *keys)
        .Add("seconds", *seconds)
        .Add("rounds", *rounds)
        .Add("work_messages", w.messages)
        .Add("work_seconds", w.seconds)
        .Add("work_per_s", work_ps)
        .Add("outbox_messages", o.messages)
        .Add("outbox_seconds", o.seconds)
        .Add("outbox_per_s", outbox_ps)
        .Add("ratio", ratio)
        .Add("by_hand_messages", h.messages)
        .Add("by_hand_seconds", h.seconds)
        .Add("by_hand_per_s", hand_ps)
        .Add("by_hand_ratio", hand_ratio);
    std::cout << j.str() << "\n";
  }
  std::fflush(stdout);
  return kExitOk;
}

// --- idem bench relay

// The channel key of a source URL (what names its queue, stream or topic).
std::string ChannelKey(const std::string& url) {
  const std::string scheme = UrlScheme(url);
  if (scheme == "redis" || scheme == "rediss") return "stream";
  if (scheme == "kafka" || scheme == "kafka-mock") return "topic";
  return "queue";
}

// What the consumer saw.
struct Seen {
  int64_t unique = 0, copies = 0, foreign = 0, order_violations = 0, missing_seq = 0;
  std::vector<int64_t> receipt_ns;  // first receipt of each id, steady clock
  Status error;
};

// Receives and acks until every one of `n` ids "<run>-<i>" was seen, the
// relays failed, or nothing new came for `idle_s`. Key of id i: i % keys.
Seen Consume(Source& source, const std::string& run, int64_t n, int64_t keys, const std::atomic<bool>& failed,
             double idle_s, Clock::time_point* last_new) {
  Seen seen;
  seen.receipt_ns.assign(static_cast<size_t>(n), 0);
  std::vector<int64_t> last_seq(static_cast<size_t>(keys), -1);
  const std::string prefix = run + "-";
  auto progress_at = Clock::now();
  while (seen.unique < n && !failed.load()) {
    auto got = source.Receive(500, 100);
    if (!got.ok()) {
      seen.error = got.status().WithContext("consumer");
      return seen;
    }
    const auto now = Clock::now();
    for (const Delivery& d : *got) {
      if (Status s = source.Ack(d); !s.ok() && s.code() != Code::kLeaseLost) {
        seen.error = s.WithContext("consumer ack");
        return seen;
      }
      const std::string& id = d.message.id;
      int64_t i = -1;
      if (id.starts_with(prefix)) {
        const char* b = id.data() + prefix.size();
        auto [p, ec] = std::from_chars(b, id.data() + id.size(), i);
        if (ec != std::errc() || p != id.data() + id.size() || i >= n) i = -1;
      }
      if (i < 0) {
        ++seen.foreign;  // the warm-up, or another run's
        continue;
      }
      ++seen.copies;
      if (seen.receipt_ns[static_cast<size_t>(i)] != 0) continue;
      seen.receipt_ns[static_cast<size_t>(i)] = NanosOf(now);
      ++seen.unique;
      progress_at = now;
      *last_new = now;
      int64_t seq = -1;
      if (auto h = d.message.Header(kOutboxSeqHeader)) std::from_chars(h->data(), h->data() + h->size(), seq);
      if (seq < 0) {
        ++seen.missing_seq;
        continue;
      }
      int64_t& last = last_seq[static_cast<size_t>(i % keys)];
      if (seq <= last) ++seen.order_violations;
      last = std::max(last, seq);
    }
    if (got->empty() && SecondsSince(progress_at) > idle_s) {
      seen.error = Status::Unavailable("nothing new for " + std::to_string(static_cast<int>(idle_s)) + " s at " +
                                       std::to_string(seen.unique) + " of " + std::to_string(n) + " messages");
      return seen;
    }
  }
  return seen;
}

// Adds messages i in [from, to) in one transaction.
Status AddRange(Store& store, Outbox& outbox, const std::string& run, int64_t keys, const std::string& payload,
                int64_t from, int64_t to, std::vector<OutgoingMessage>& buf) {
  buf.resize(static_cast<size_t>(to - from));
  for (int64_t i = from; i < to; ++i) {
    OutgoingMessage& m = buf[static_cast<size_t>(i - from)];
    m.id = run + "-" + std::to_string(i);
    m.key = "key-" + std::to_string(i % keys);
    m.payload = payload;
  }
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_RETURN_IF_ERROR(outbox.AddMany(*tx, buf).status());
  return tx->Commit();
}

// The relay benchmark's flags.
struct RelaySettings {
  int64_t n = 50'000, keys = 100, bytes = 100, relays = 1, rate = 0, batch = 500;
  std::string store_url, to;
  bool json = false;
};

Result<RelaySettings> ParseRelaySettings(const Args& args) {
  RelaySettings st;
  if (!args.Has("to")) return Status::InvalidArgument("--to URL is required (the relay's destination)");
  auto n = args.Has("messages") ? args.GetInt("messages", 1, int64_t{1} << 32) : Result<int64_t>(st.n);
  auto keys = args.Has("keys") ? args.GetInt("keys", 1, int64_t{1} << 32) : Result<int64_t>(st.keys);
  auto bytes = args.Has("payload-bytes") ? args.GetInt("payload-bytes", 0, 1 << 20) : Result<int64_t>(st.bytes);
  auto relays = args.Has("relays") ? args.GetInt("relays", 1, 64) : Result<int64_t>(st.relays);
  auto rate = args.Has("rate") ? args.GetInt("rate", 1, 10'000'000) : Result<int64_t>(st.rate);
  auto batch = args.Has("batch") ? args.GetInt("batch", 1, 10'000) : Result<int64_t>(st.batch);
  for (const auto* r : {&n, &keys, &bytes, &relays, &rate, &batch}) IDEM_RETURN_IF_ERROR(r->status());
  st.n = *n, st.keys = *keys, st.bytes = *bytes, st.relays = *relays, st.rate = *rate, st.batch = *batch;
  if (st.rate > 0 && st.relays != 1)
    return Status::InvalidArgument("--rate measures latency with one relay: drop --relays");
  st.store_url = args.Get("store");
  st.to = args.Get("to");
  st.json = args.Bool("json");
  return st;
}

// Publishes what an earlier run left unsent away first.
Status EmptyOutbox(Store& store, Outbox& outbox) {
  IDEM_ASSIGN_OR_RETURN(OutboxStats st, outbox.Stats());
  if (st.backlog == 0) return Status::OK();
  std::fprintf(stderr, "bench relay: publishing %lld earlier unsent messages away first\n",
               static_cast<long long>(st.backlog));
  return DrainOutbox(store);
}

// The destination: the URL's channel, or one of this run's own, and its
// consumer, warmed up (untimed: connections, the queue declared, a group
// joined). The consumer of an embedded queue acks without fsync (its
// durability is not what is measured).
Result<OpenedSource> OpenDestination(const std::string& to, const std::string& run, std::string& channel_url) {
  const bool embedded = UrlScheme(to) == "embedded";
  channel_url = embedded ? to : WithKey(to, ChannelKey(to), "idem-bench-relay-" + run);
  IDEM_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(embedded ? WithKey(channel_url, "durable", "false") : channel_url,
                                                     {.lease_ms = 60'000, .consumer = "bench-relay"}));
  Message warm{.id = "warm-" + run, .payload = "warm"};
  IDEM_RETURN_IF_ERROR(src.publish(warm).WithContext("warm-up"));
  bool got = false;
  const auto t0 = Clock::now();
  while (!got && SecondsSince(t0) < 30) {
    auto d = src.source->Receive(100, 100);
    if (!d.ok()) return d.status().WithContext("warm-up");
    for (const Delivery& x : *d) {
      (void)src.source->Ack(x);
      got = got || x.message.id == warm.id;
    }
  }
  if (!got) return Status::Unavailable("warm-up: the consumer did not receive its message in 30 s");
  return src;
}

// The relays, each with its own store and publisher.
struct Relays {
  std::vector<std::unique_ptr<Store>> stores;
  std::vector<std::unique_ptr<Publisher>> publishers;
  std::vector<std::unique_ptr<OutboxRelay>> relays;
};

Status OpenRelays(const RelaySettings& st, const std::string& pub_url, Relays& out) {
  for (int r = 0; r < static_cast<int>(st.relays); ++r) {
    IDEM_ASSIGN_OR_RETURN(auto rs, OpenStore(st.store_url, true, 2));
    IDEM_ASSIGN_OR_RETURN(auto p, OpenPublisher(pub_url));
    IDEM_ASSIGN_OR_RETURN(auto relay, OutboxRelay::Open(*rs, *p,
                                                        {.name = "bench-relay-" + std::to_string(r),
                                                         .batch = static_cast<int>(st.batch),
                                                         .poll_ms = 100}));
    out.stores.push_back(std::move(rs));
    out.publishers.push_back(std::move(p));
    out.relays.push_back(std::move(relay));
  }
  return Status::OK();
}

// Fills the outbox before the clock starts, in transactions of 100.
Result<double> Preload(const RelaySettings& st, Store& store, Outbox& outbox, const std::string& run,
                       const std::string& payload) {
  std::vector<OutgoingMessage> buf;
  const auto t0 = Clock::now();
  Progress progress("preloading the outbox", st.n);
  for (int64_t i = 0; i < st.n; i += 100) {
    IDEM_RETURN_IF_ERROR(
        AddRange(store, outbox, run, st.keys, payload, i, std::min(st.n, i + 100), buf).WithContext("preload"));
    progress.Update(std::min(st.n, i + 100));
  }
  progress.Done();
  return SecondsSince(t0);
}

// The producer, here: at st.rate messages/s, as a service's requests would
// come: every 5 ms, what is due since the last tick, in transactions of up
// to 1,000 (not a commit whenever one message is due, which would keep
// SQLite's one writer busy all the time; at tens of thousands a second one
// synced commit per 100 is more than one connection can make). Each
// message's commit time goes to `commit_ns`.
Status Produce(const RelaySettings& st, Store& store, Outbox& outbox, const std::string& run,
               const std::string& payload, Clock::time_point t0, std::atomic<bool>& failed,
               std::vector<int64_t>& commit_ns) {
  std::vector<OutgoingMessage> buf;
  int64_t added = 0;
  while (added < st.n && !failed.load()) {
    const int64_t due = std::min<int64_t>(st.n, static_cast<int64_t>(SecondsSince(t0) * static_cast<double>(st.rate)));
    if (due <= added) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    const int64_t to_i = std::min(due, added + 1000);
    if (Status s = AddRange(store, outbox, run, st.keys, payload, added, to_i, buf); !s.ok()) {
      failed = true;
      return s.WithContext("producer");
    }
    const int64_t at = NanosOf(Clock::now());
    for (int64_t i = added; i < to_i; ++i) commit_ns[static_cast<size_t>(i)] = at;
    added = to_i;
  }
  return Status::OK();
}

// When the relays had every message confirmed by the broker (the relays'
// own rate; the consumer may still be behind), in seconds from t0.
double WaitRelayed(const RelaySettings& st, Relays& relays, Clock::time_point t0, const std::atomic<bool>& failed) {
  for (;;) {
    uint64_t published = 0;
    for (auto& relay : relays.relays) published += relay->stats().published;
    if (published >= static_cast<uint64_t>(st.n) || failed.load() || SecondsSince(t0) > 600) return SecondsSince(t0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

OutboxRelayStats SumStats(Relays& relays) {
  OutboxRelayStats total;
  for (auto& relay : relays.relays) {
    const OutboxRelayStats st = relay->stats();
    total.published += st.published;
    total.republished += st.republished;
    total.transient_errors += st.transient_errors;
    total.dead_lettered += st.dead_lettered;
    total.rounds += st.rounds;
    total.store_us += st.store_us;
    total.publish_us += st.publish_us;
  }
  return total;
}

// What the timed part measured.
struct RelayRun {
  Seen seen;
  OutboxRelayStats total;
  double seconds = 0, relayed_s = 0, preload_s = 0;
  std::vector<double> lat_ms;  // commit -> receipt, sorted (--rate)
};

// The relays' own time: rows through the store (fetch + settle) per second
// of store time, and per second of publishing.
double RowsPerS(const RelayRun& r, uint64_t us) {
  return us > 0 ? static_cast<double>(r.total.published) * 1e6 / us : 0.0;
}

// The result line, and the JSON object with --json.
void PrintRelayResult(const RelaySettings& st, const std::string& store_kind, const std::string& to_kind, RelayRun& r) {
  const double per_s = r.seconds > 0 ? static_cast<double>(st.n) / r.seconds : 0;
  const double relayed_per_s = r.relayed_s > 0 ? static_cast<double>(st.n) / r.relayed_s : 0.0;
  std::printf(
      "peer=idem-relay store=%s to=%s messages=%lld seconds=%.3f messages_per_s=%.1f republished=%llu "
      "order_violations=%lld keys=%lld payload_bytes=%lld relays=%d duplicates=%lld rounds=%llu",
      store_kind.c_str(), to_kind.c_str(), static_cast<long long>(st.n), r.seconds, per_s,
      static_cast<unsigned long long>(r.total.republished), static_cast<long long>(r.seen.order_violations),
      static_cast<long long>(st.keys), static_cast<long long>(st.bytes), static_cast<int>(st.relays),
      static_cast<long long>(r.seen.copies - r.seen.unique), static_cast<unsigned long long>(r.total.rounds));
  std::printf(" relayed_per_s=%.0f store_rows_per_s=%.0f publish_rows_per_s=%.0f", relayed_per_s,
              RowsPerS(r, r.total.store_us), RowsPerS(r, r.total.publish_us));
  std::vector<double>& lat_ms = r.lat_ms;
  if (st.rate > 0) {
    std::printf(" rate=%lld p50_ms=%.2f p99_ms=%.2f p999_ms=%.2f max_ms=%.2f", static_cast<long long>(st.rate),
                PercentileOfSorted(lat_ms, 0.5), PercentileOfSorted(lat_ms, 0.99), PercentileOfSorted(lat_ms, 0.999),
                lat_ms.back());
  } else {
    std::printf(" preload_per_s=%.1f", static_cast<double>(st.n) / r.preload_s);
  }
  std::printf("\n");
  if (!st.json) return;
  Json j;
  j.Add("bench", "relay")
      .Add("store", store_kind)
      .Add("to", to_kind)
      .Add("messages", st.n)
      .Add("keys", st.keys)
      .Add("payload_bytes", st.bytes)
      .Add("relays", static_cast<int>(st.relays))
      .Add("batch", st.batch)
      .Add("seconds", r.seconds)
      .Add("messages_per_s", per_s)
      .Add("published", r.total.published)
      .Add("republished", r.total.republished)
      .Add("transient_errors", r.total.transient_errors)
      .Add("dead_lettered", r.total.dead_lettered)
      .Add("rounds", r.total.rounds)
      .Add("relayed_per_s", relayed_per_s)
      .Add("store_seconds", static_cast<double>(r.total.store_us) / 1e6)
      .Add("publish_seconds", static_cast<double>(r.total.publish_us) / 1e6)
      .Add("store_rows_per_s", RowsPerS(r, r.total.store_us))
      .Add("publish_rows_per_s", RowsPerS(r, r.total.publish_us))
      .Add("duplicates", r.seen.copies - r.seen.unique)
      .Add("order_violations", r.seen.order_violations)
      .Add("missing_seq", r.seen.missing_seq);
  if (st.rate > 0) {
    j.Add("rate", st.rate)
        .Add("p50_ms", PercentileOfSorted(lat_ms, 0.5))
        .Add("p99_ms", PercentileOfSorted(lat_ms, 0.99))
        .Add("p999_ms", PercentileOfSorted(lat_ms, 0.999))
        .Add("max_ms", lat_ms.back());
  } else {
    j.Add("preload_seconds", r.preload_s);
  }
  std::cout << j.str() << "\n";
}

// The timed part: the consumer and the relays in threads (and the producer
// here with --rate) until every id has come through.
Status RunRelays(const RelaySettings& st, Store& store, Outbox& outbox, Source& source, Relays& relays,
                 const std::string& run, const std::string& payload, RelayRun& r) {
  const int nr = static_cast<int>(st.relays);
  std::atomic<bool> failed{false};
  std::vector<Status> relay_status(static_cast<size_t>(nr));
  std::vector<std::thread> threads;
  Clock::time_point last_new;
  std::vector<int64_t> commit_ns(static_cast<size_t>(st.rate > 0 ? st.n : 0), 0);
  Status producer_status;
  const auto t0 = Clock::now();
  std::thread consumer([&] { r.seen = Consume(source, run, st.n, st.keys, failed, 30, &last_new); });
  for (int i = 0; i < nr; ++i)
    threads.emplace_back([&, i] {
      relay_status[static_cast<size_t>(i)] = relays.relays[static_cast<size_t>(i)]->Run();
      if (!relay_status[static_cast<size_t>(i)].ok()) failed = true;
    });
  if (st.rate > 0) producer_status = Produce(st, store, outbox, run, payload, t0, failed, commit_ns);
  r.relayed_s = WaitRelayed(st, relays, t0, failed);
  consumer.join();
  r.seconds = std::chrono::duration<double>(last_new - t0).count();
  for (auto& relay : relays.relays) relay->Stop();
  for (auto& t : threads) t.join();
  r.total = SumStats(relays);
  IDEM_RETURN_IF_ERROR(producer_status);
  for (const Status& s : relay_status) IDEM_RETURN_IF_ERROR(s.WithContext("relay"));
  IDEM_RETURN_IF_ERROR(r.seen.error);
  if (st.rate > 0) {
    r.lat_ms.reserve(static_cast<size_t>(st.n));
    for (size_t i = 0; i < commit_ns.size(); ++i)
      r.lat_ms.push_back(std::max<double>(0, static_cast<double>(r.seen.receipt_ns[i] - commit_ns[i]) / 1e6));
    std::sort(r.lat_ms.begin(), r.lat_ms.end());
  }
  return Status::OK();
}

int RunBenchRelayCmd(const Args& args) {
  const std::string cmd = "bench relay";
  auto settings = ParseRelaySettings(args);
  if (!settings.ok()) return Fail(cmd, settings.status());
  const RelaySettings& st = *settings;
  auto store_or = OpenStore(st.store_url, true, 2);
  if (!store_or.ok()) return Fail(cmd, store_or.status());
  Store& store = **store_or;
  auto outbox_owned = Outbox::Open(store);
  if (!outbox_owned.ok()) return Fail(cmd, outbox_owned.status());
  Outbox& outbox = **outbox_owned;
  if (Status s = EmptyOutbox(store, outbox); !s.ok()) return Fail(cmd, s);
  const std::string run = "r" + std::to_string(Env::Default()->NowMs());
  std::string channel_url;
  auto src = OpenDestination(st.to, run, channel_url);
  if (!src.ok()) return Fail(cmd, src.status());
  // The relays' publishers: on the consumer's broker and channel
  // (kafka-mock: the cluster's own address).
  const std::string pub_url = UrlScheme(st.to) == "kafka-mock" ? src->shared_url : channel_url;
  Relays relays;
  if (Status s = OpenRelays(st, pub_url, relays); !s.ok()) return Fail(cmd, s);
  const std::string payload(static_cast<size_t>(st.bytes), 'p');
  RelayRun r;
  if (st.rate == 0) {
    auto preload_s = Preload(st, store, outbox, run, payload);
    if (!preload_s.ok()) return Fail(cmd, preload_s.status());
    r.preload_s = *preload_s;
  }
  if (Status s = RunRelays(st, store, outbox, *src->source, relays, run, payload, r); !s.ok()) return Fail(cmd, s);
  PrintRelayResult(st, std::string(store.Kind()), src->kind, r);
  std::fflush(stdout);
  if (src->close) (void)src->close();
  const Seen& seen = r.seen;
  if (seen.order_violations > 0 || seen.missing_seq > 0 || seen.unique != st.n) {
    std::fprintf(stderr, "CORRECTNESS CHECK FAILED: %lld of %lld ids, %lld order violations, %lld without seq\n",
                 static_cast<long long>(seen.unique), static_cast<long long>(st.n),
                 static_cast<long long>(seen.order_violations), static_cast<long long>(seen.missing_seq));
    return kExitCheckFailed;
  }
  return kExitOk;
}

}  // namespace

// --- idem bench observer: the Inbox's work with and without an observer
// (idem::Metrics), in alternating rounds on one store.
int RunBenchObserver(const Args& args) {
  const std::string cmd = "bench observer";
  auto batch = args.Has("batch") ? args.GetInt("batch", 1, 10'000) : Result<int64_t>(1);
  auto rounds = args.GetInt("rounds", 1, 1000);
  for (const auto* r : {&batch, &rounds})
    if (!r->ok()) return Fail(cmd, r->status());
  auto seconds = args.GetDouble("seconds", 0.001, 3600);
  if (!seconds.ok()) return Fail(cmd, seconds.status());
  std::string url = args.Get("store");
  const bool pg = IsPostgresScheme(url);
  if (!pg) url = WithKey(url, "synchronous", *batch == 1 ? "full" : "normal");
  auto store_or = OpenStore(url, true, 2);
  if (!store_or.ok()) return Fail(cmd, store_or.status());
  Store& store = **store_or;
  if (Status s = bench::PrepareBusinessTable(store); !s.ok()) return Fail(cmd, s.WithContext("business table"));
  Metrics metrics;
  auto plain_owned = Inbox::Open(store, Inbox::Options{.consumer = "bench-observer"});
  auto observed_owned = Inbox::Open(store, Inbox::Options{.consumer = "bench-observer", .observer = &metrics});
  if (!plain_owned.ok()) return Fail(cmd, plain_owned.status());
  if (!observed_owned.ok()) return Fail(cmd, observed_owned.status());
  auto plain = [&](std::span<const Message> b) { return bench::GuardedBatch(**plain_owned, b); };
  auto observed = [&](std::span<const Message> b) { return bench::GuardedBatch(**observed_owned, b); };
#if IDEM_HAVE_HTTP
  // The third side: Metrics and the live view's Feed, read by one page (a
  // thread taking a batch every 100 ms, as /events does).
  live::Feed feed("idem bench observer");
  Observers both({&metrics, &feed});
  auto live_owned = Inbox::Open(store, Inbox::Options{.consumer = "bench-observer", .observer = &both});
  if (!live_owned.ok()) return Fail(cmd, live_owned.status());
  auto with_live = [&](std::span<const Message> b) { return bench::GuardedBatch(**live_owned, b); };
  std::atomic<bool> page_done{false};
  live::Cursor page_cursor;
  uint64_t page_events = 0;
  (void)feed.Snapshot(&page_cursor);
  std::thread page([&] {
    while (!page_done.load()) {
      const std::string batch = feed.Batch(&page_cursor, 100, 300);
      if (!batch.empty()) ++page_events;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  Side l;
#endif
  bench::IdGenerator ids(bench::IdKind::kOrdered, bench::FreshSeed());
  const size_t nb = static_cast<size_t>(*batch);
  Side p, o;
  Status s = Measure(ids, nb, std::min(0.5, *seconds / 4), nullptr, plain);
  if (s.ok()) s = Measure(ids, nb, std::min(0.5, *seconds / 4), nullptr, observed);
  {
    Progress progress("measuring the Inbox without and with an observer", 3 * *rounds);
    for (int64_t r = 0; s.ok() && r < *rounds; ++r) {
      s = Measure(ids, nb, *seconds, &p, plain);
      progress.Update(3 * r + 1);
      if (s.ok()) s = Measure(ids, nb, *seconds, &o, observed);
      progress.Update(3 * r + 2);
#if IDEM_HAVE_HTTP
      if (s.ok()) s = Measure(ids, nb, *seconds, &l, with_live);
#endif
      progress.Update(3 * r + 3);
    }
  }
#if IDEM_HAVE_HTTP
  page_done.store(true);
  page.join();
#endif
  if (Status c = bench::PrepareBusinessTable(store); s.ok() && !c.ok()) s = c;
  if (!s.ok()) return Fail(cmd, s);
  const double plain_ps = p.PerSecond(), observed_ps = o.PerSecond();
  const double ratio = observed_ps > 0 ? plain_ps / observed_ps : INFINITY;
  for (size_t r = 0; r < p.rounds.size(); ++r)
    std::printf("round %zu: without %.0f/s, with Metrics %.0f/s\n", r + 1, p.rounds[r], o.rounds[r]);
  std::printf("bench=observer store=%s batch=%lld without_per_s=%.1f with_per_s=%.1f ratio=%.3f applied=%llu",
              std::string(store.Kind()).c_str(), static_cast<long long>(*batch), plain_ps, observed_ps, ratio,
              static_cast<unsigned long long>(metrics.Count(EventKind::kApplied, "bench-observer")));
#if IDEM_HAVE_HTTP
  // With the live view: its rate, the ratio to the side without an
  // observer, and what its page was sent (batches) and skipped (dropped
  // or coalesced: the page is never waited for).
  const double live_ps = l.PerSecond();
  const double live_ratio = live_ps > 0 ? plain_ps / live_ps : INFINITY;
  for (size_t r = 0; r < l.rounds.size(); ++r)
    std::printf("\nround %zu: with the live view %.0f/s", r + 1, l.rounds[r]);
  std::printf("\nbench=observer-live with_live_per_s=%.1f live_ratio=%.3f page_batches=%llu page_skipped=%llu", live_ps,
              live_ratio, static_cast<unsigned long long>(page_events),
              static_cast<unsigned long long>(page_cursor.dropped));
#endif
  std::printf("\n");
  if (args.Bool("json")) {
    std::cout << Json()
                     .Add("bench", "observer")
                     .Add("store", std::string(store.Kind()))
                     .Add("batch", *batch)
                     .Add("without_per_s", plain_ps)
                     .Add("with_per_s", observed_ps)
                     .Add("ratio", ratio)
                     .str()
              << "\n";
  }
  std::fflush(stdout);
  return kExitOk;
}

int RunBenchOutbox(const Args& args) {
  const std::string& sub = args.positional()[0];
  if (sub == "observer") return RunBenchObserver(args);
  return sub == "relay" ? RunBenchRelayCmd(args) : RunOutboxAdd(args);
}

}  // namespace idem::cli
