// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem run: the payments consumer against any source and store, with
// Prometheus metrics and progress lines; and idem publish, its producer.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <random>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>

#include "commands.h"
#include "components.h"
#include "idem/consumer.h"
#include "idem/inbox.h"
#include "idem/metrics.h"
#include "idem/outbox_relay.h"
#include "idem/retention.h"
#include "long_running.h"
#include "payments.h"
#include "sources.h"
#if IDEM_HAVE_DYNAMODB
#include "dynamodb/ddb.h"
#endif

namespace idem::cli {
namespace {

constexpr const char* kCreateRunPayments =
    "CREATE TABLE IF NOT EXISTS idem_run_payments(order_id TEXT NOT NULL, message_id TEXT NOT NULL,"
    " cents BIGINT NOT NULL)";

// The payments consumer's work: one row per message, payload "ORDER:CENTS".
Status RecordPayment(Transaction& tx, const Message& m) {
  auto colon = m.payload.find(':');
  char* end = nullptr;
  long long cents = colon == std::string::npos ? 0 : std::strtoll(m.payload.c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || colon == 0 || end == nullptr || *end != '\0' || cents <= 0)
    return Status::Rejected("malformed payment payload '" + m.payload.substr(0, 80) + "' (want ORDER:CENTS)");
#if IDEM_HAVE_DYNAMODB
  // DynamoDB: an item of the table idem_run_payments (payments.h).
  if (dynamodb_internal::ItemsIn(tx) != nullptr) return InsertPayment(tx, m, "", "idem_run_payments");
#endif
  return tx
      .Exec("INSERT INTO idem_run_payments(order_id, message_id, cents) VALUES ($1, $2, $3)",
            {m.payload.substr(0, colon), m.id, static_cast<int64_t>(cents)})
      .status();
}

// Served on --metrics: the Inbox's and the Consumer's events counted by
// idem::Metrics (the same text a service gets from the library), and the
// receive errors, which are no event.
std::string MetricsText(const Metrics& registry, const std::string& consumer, const ConsumerStats& s) {
  std::string out = registry.Render();
  AppendMetric(out, "idem_receive_errors_total", "Failed receives from the source.", "counter",
               "consumer=\"" + consumer + "\"", s.receive_errors);
  return out;
}

// The most worker threads `idem run --workers` starts.
constexpr int64_t kMaxWorkers = 256;

// A consumer name the Inbox accepts (else it would refuse every message, and
// the run would retry them forever).
Status ValidateConsumer(const std::string& name) {
  if (ValidateId(name).ok()) return Status::OK();
  return Status::InvalidArgument("--consumer must be a name of 1 to " + std::to_string(kMaxIdBytes) + " bytes, got " +
                                 (name.empty() ? std::string("an empty one") : std::to_string(name.size()) + " bytes"));
}

// Runs `runner` on `workers` threads (this one included) until it returns.
// The threads are started here rather than by Consumer::Run, so that one the
// system refuses is an error (kUnavailable, the others stopped and joined)
// instead of an exception that would abort: each extra thread calls Run()
// of a one-worker Consumer, the same loop Run's own workers would.
Status RunWorkers(Consumer& runner, int workers) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers));
  Status started;
  for (int i = 1; i < workers; ++i) {
    try {
      threads.emplace_back([&runner] { (void)runner.Run(); });
    } catch (const std::system_error& e) {
      started = Status::Unavailable("cannot start worker thread " + std::to_string(i + 1) + " of " +
                                    std::to_string(workers) + ": " + e.what() + " (lower --workers)");
      runner.Stop();
      break;
    }
  }
  Status s = started.ok() ? runner.Run() : Status::OK();
  for (auto& t : threads) t.join();
  return started.ok() ? s : started;
}

}  // namespace

const Command& RunCommand() {
  static const Command c{
      "run",
      "Run the payments consumer: receive from --source, apply each message once in --store (one row in\n"
      "idem_run_payments per message; payload ORDER:CENTS) and acknowledge only after the commit.\n"
      "Sources (those this build has): " +
          KnownSources() +
          ".\n"
          "Prometheus metrics on --metrics HOST:PORT (GET /metrics); the live view (a page animating each\n"
          "delivery, marker, duplicate and ack, with /metrics) on --web HOST:PORT; a progress line on stderr\n"
          "every 5 s.\n"
          "Stops on SIGINT/SIGTERM (in-flight messages finish or are given back), or when idle with --drain.\n"
          "--relay-to URL also runs an outbox relay (idem relay) on the store, in this process: on a thread\n"
          "until the consumer stops, and with --drain then until the outbox is empty.",
      "--source URL [--store URL] [--consumer NAME] [--workers N] [--batch N] [--max-attempts N]\n"
      "       [--lease DURATION] [--id-from SPEC] [--drain] [--relay-to URL] [--metrics HOST:PORT]\n"
      "       [--web HOST:PORT] [--json]",
      {{"source", "URL", "", "where the messages come from"},
       {"store", "URL", "sqlite:idem.db", "the store (sqlite:PATH, postgres://... or dynamodb://TABLE?...)"},
       {"consumer", "NAME", "payments", "the consumer's name (markers, consumer group member): 1 to 255 bytes"},
       {"workers", "N", "1", "worker threads, 1..256"},
       {"batch", "N", "1", "deliveries per transaction, 1..10000"},
       {"max-attempts", "N", "5", "handler failures before a message is dead-lettered"},
       {"lease", "DURATION", "30s", "visibility timeout where the source has one"},
       {"id-from", "SPEC", "",
        "take each message's id from its payload or a header instead of the source's id:\n"
        "          json:/order/id, header:X-Order-Id, or parts joined by + (values joined by ':');\n"
        "          a message without it is dead-lettered (reason rejected)"},
       {"drain", "", "", "return once the source is idle"},
       {"relay-to", "URL", "", "also relay the store's outbox to this broker (see idem relay --help)"},
       {"metrics", "HOST:PORT", "", "serve Prometheus metrics on GET /metrics"},
       {"web", "HOST:PORT", "", "serve the live view on GET / (events on /events, metrics on /metrics)"},
       {"json", "", "", "print the final counters as one JSON object"}}};
  return c;
}

// idem run's flags.
struct RunSettings {
  int64_t workers = 0, batch = 0, attempts = 0, lease = 0;
  std::string consumer;
  std::optional<IdFrom> id_from;
};

Result<RunSettings> ParseRunSettings(const Args& args) {
  RunSettings st;
  if (!args.Has("source")) return Status::InvalidArgument("--source is required");
  auto workers = args.GetInt("workers");
  auto batch = args.GetInt("batch");
  auto attempts = args.GetInt("max-attempts");
  auto lease = ParseDurationMs(args.Get("lease"));
  for (const auto* r : {&workers, &batch, &attempts, &lease}) IDEM_RETURN_IF_ERROR(r->status());
  st.workers = *workers, st.batch = *batch, st.attempts = *attempts, st.lease = *lease;
  if (st.workers < 1 || st.workers > kMaxWorkers)
    return Status::InvalidArgument("--workers must be from 1 to " + std::to_string(kMaxWorkers) + ", got " +
                                   std::to_string(st.workers));
  if (st.batch < 1 || st.batch > 10'000 || st.attempts < 0 || st.attempts > 1'000'000 || st.lease <= 0)
    return Status::InvalidArgument("need 1 <= --batch <= 10000, 0 <= --max-attempts <= 1000000 and --lease > 0");
  st.consumer = args.Get("consumer");
  IDEM_RETURN_IF_ERROR(ValidateConsumer(st.consumer));
  if (args.Has("id-from")) {
    auto parsed = IdFrom::Parse(args.Get("id-from"));
    if (!parsed.ok()) return parsed.status().WithContext("--id-from");
    st.id_from = std::move(*parsed);
  }
  IDEM_RETURN_IF_ERROR(MetricsServer::Validate(args));
  IDEM_RETURN_IF_ERROR(LiveView::Validate(args));
  return st;
}

Status CreateRunPayments(Store& store) {
  if (store.Kind() == "dynamodb") return EnsurePayments(store, "idem_run_payments");
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_RETURN_IF_ERROR(tx->Exec(kCreateRunPayments).status());
  return tx->Commit();
}

// --relay-to with --drain: what the consumer's last commits added, by a
// relay that stops when idle; its figures added to `relayed`.
Status DrainAtEnd(Store& store, Publisher& publisher, const std::string& consumer, OutboxRelayStats& relayed) {
  IDEM_ASSIGN_OR_RETURN(auto drain,
                        OutboxRelay::Open(store, publisher, {.name = "run-" + consumer, .stop_when_idle = true}));
  StopOnSignals(drain.get());  // beside the consumer's; detached when the relay goes
  Status s = drain->Run();
  relayed.published += drain->stats().published;
  relayed.republished += drain->stats().republished;
  relayed.dead_lettered += drain->stats().dead_lettered;
  return s;
}

void PrintRunSummary(bool json, const std::string& source_kind, const InboxCounters& c, const ConsumerStats& st,
                     bool relay, const OutboxRelayStats& relayed) {
  if (json) {
    std::cout << Json()
                     .Add("source", source_kind)
                     .Add("applied", c.applied)
                     .Add("duplicates", c.duplicates)
                     .Add("conflicts", c.conflicts)
                     .Add("failures", c.failures)
                     .Add("in_progress", st.in_progress)
                     .Add("parked", st.parked)
                     .Add("rejected", st.rejected)
                     .Add("dead_lettered", st.dead_lettered)
                     .Add("received", st.received)
                     .Add("acked", st.acked)
                     .Add("nacked", st.nacked)
                     .Add("relayed", relayed.published)
                     .Add("relay_republished", relayed.republished)
                     .Add("relay_dead_lettered", relayed.dead_lettered)
                     .str()
              << "\n";
  } else {
    std::cout << "applied " << c.applied << ", duplicates " << c.duplicates << ", conflicts " << c.conflicts
              << ", dead-lettered " << st.dead_lettered << "; received " << st.received << ", acked " << st.acked
              << (relay ? "; relayed " + std::to_string(relayed.published) : std::string()) << "\n";
  }
}

int RunRun(const Args& args) {
  const std::string cmd = "run";
  auto settings = ParseRunSettings(args);
  if (!settings.ok()) return Fail(cmd, settings.status());
  const RunSettings& st = *settings;
  const std::string& consumer = st.consumer;
  auto source = OpenSource(args.Get("source"), {.lease_ms = st.lease, .consumer = consumer});
  if (!source.ok()) return Fail(cmd, source.status());
  std::unique_ptr<Publisher> relay_publisher;
  if (args.Has("relay-to")) {
    auto p = OpenPublisherFlag("relay-to", args.Get("relay-to"));
    if (!p.ok()) return Fail(cmd, p.status());
    relay_publisher = std::move(*p);
  }
  auto store = OpenStore(args.Get("store"), true, static_cast<int>(st.workers) + 3);
  if (!store.ok()) return Fail(cmd, store.status());
  if (Status s = CreateRunPayments(**store); !s.ok()) return Fail(cmd, s);
  Metrics registry;
  // The age of the oldest message the source may still deliver: the
  // shortest marker retention a purge would accept now.
  AddHorizonGauge(registry, *source->source, consumer);
  // Declared before what it observes: it outlives them. Its /metrics adds
  // the runner's counters once there is one.
  std::atomic<Consumer*> served{nullptr};
  auto view = LiveView::Start(args, "idem run", [&] {
    Consumer* c = served.load();
    return c != nullptr ? MetricsText(registry, consumer, c->stats()) : registry.Render();
  });
  if (!view.ok()) return Fail(cmd, view.status());
  Observers observers({&registry, *view ? (*view)->observer() : nullptr});
  auto inbox_owned = Inbox::Open(**store, Inbox::Options{.consumer = consumer, .observer = &observers});
  if (!inbox_owned.ok()) return Fail(cmd, inbox_owned.status());
  Inbox& inbox = **inbox_owned;
  // One worker per Consumer::Run call: RunWorkers starts the threads.
  auto runner_owned = Consumer::Open(*source->source, inbox, RecordPayment,
                                     Consumer::Options{.workers = 1,
                                                       .batch = static_cast<int>(st.batch),
                                                       .max_attempts = static_cast<int>(st.attempts),
                                                       .stop_when_idle = args.Bool("drain"),
                                                       .id_from = st.id_from});
  if (!runner_owned.ok()) return Fail(cmd, runner_owned.status());
  Consumer& runner = **runner_owned;
  // --relay-to: on a thread while the consumer runs; with --drain, to the
  // end of the outbox once the consumer is done.
  std::unique_ptr<OutboxRelay> relay;
  if (relay_publisher) {
    auto r = OutboxRelay::Open(**store, *relay_publisher, {.name = "run-" + consumer, .observer = &observers});
    if (!r.ok()) return Fail(cmd, r.status());
    relay = std::move(*r);
  }
  Status relay_status;
  std::thread relay_thread;
  auto stop_relay = [&] {
    if (!relay_thread.joinable()) return;
    relay->Stop();
    relay_thread.join();
  };

  served.store(&runner);
  auto metrics = MetricsServer::Start(args, [&] { return MetricsText(registry, consumer, runner.stats()); });
  if (!metrics.ok()) return Fail(cmd, metrics.status());
  auto stop_metrics = [&] { metrics->reset(); };
  StopOnSignals(&runner);
  int64_t last = 0;
  auto progress = ProgressLines::Start([&] {
    InboxCounters c = inbox.counters();
    std::fprintf(stderr, "idem run: %llu applied, %llu duplicates, %llu failures, %llu dead-lettered (+%lld in 5 s)\n",
                 static_cast<unsigned long long>(c.applied), static_cast<unsigned long long>(c.duplicates),
                 static_cast<unsigned long long>(c.failures), static_cast<unsigned long long>(c.dead_lettered),
                 static_cast<long long>(static_cast<int64_t>(c.applied + c.duplicates) - last));
    last = static_cast<int64_t>(c.applied + c.duplicates);
  });
  if (!progress.ok()) {
    StopOnSignals(nullptr);
    stop_metrics();
    return Fail(cmd, progress.status());
  }
  if (relay) {
    try {
      relay_thread = std::thread([&] { relay_status = relay->Run(); });
    } catch (const std::system_error& e) {
      StopOnSignals(nullptr);
      return Fail(cmd, Status::Unavailable(std::string("cannot start the relay thread: ") + e.what()));
    }
  }
  Status s = RunWorkers(runner, static_cast<int>(st.workers));
  stop_relay();
  OutboxRelayStats relayed = relay ? relay->stats() : OutboxRelayStats{};
  if (relay && args.Bool("drain") && s.ok() && relay_status.ok() && !runner.stopping()) {
    relay_status = DrainAtEnd(**store, *relay_publisher, consumer, relayed);
  }
  progress->reset();
  StopOnSignals(nullptr);
  stop_metrics();
  if (source->close) {
    // A failed clean stop loses nothing (the name stays in the group; its
    // entries, if any, are taken over after their leases): say so, go on.
    if (Status cs = source->close(); !cs.ok())
      std::fprintf(stderr, "idem run: clean stop of the source failed (nothing is lost): %s\n", cs.ToString().c_str());
  }
  PrintRunSummary(args.Bool("json"), source->kind, inbox.counters(), runner.stats(), relay != nullptr, relayed);
  if (!s.ok()) return Fail(cmd, s);
  if (!relay_status.ok()) return Fail(cmd, relay_status.WithContext("relay"));
  return kExitOk;
}

const Command& PublishCommand() {
  static const Command c{
      "publish",
      "Publish payment messages (payload ORDER:CENTS, ids pay-<run>-<n>) to a source, as a producer\n"
      "would; --dup-rate publishes that share of them twice (a producer retry).",
      "--source URL [--messages N] [--dup-rate R] [--rate R] [--json]",
      {{"source", "URL", "", "where to publish (see idem run --help)"},
       {"messages", "N", "1000", "how many distinct messages"},
       {"dup-rate", "R", "0", "fraction of messages published twice (0..1)"},
       {"rate", "R", "0", "messages per second, spread evenly (0: as fast as the source takes them)"},
       {"json", "", "", "print the counts as one JSON object"}}};
  return c;
}

int RunPublish(const Args& args) {
  const std::string cmd = "publish";
  if (!args.Has("source")) return Fail(cmd, Status::InvalidArgument("--source is required"));
  auto n = args.GetInt("messages");
  if (!n.ok()) return Fail(cmd, n.status());
  if (*n < 1) return Fail(cmd, Status::InvalidArgument("--messages must be at least 1"));
  auto dup_rate = args.GetDouble("dup-rate", 0, 1);
  if (!dup_rate.ok()) return Fail(cmd, dup_rate.status());
  const double dup = *dup_rate;
  auto rate = args.GetDouble("rate", 0, 1e7);
  if (!rate.ok()) return Fail(cmd, rate.status());
  auto source = OpenSource(args.Get("source"), {});
  if (!source.ok()) return Fail(cmd, source.status());
  std::mt19937_64 rng(42);
  const std::string run = std::to_string(Env::Default()->NowMs());
  int64_t published = 0, expected_cents = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < *n; ++i) {
    if (*rate > 0)  // message i is due i / rate seconds after the start
      std::this_thread::sleep_until(start + std::chrono::microseconds(static_cast<int64_t>(1e6 * i / *rate)));
    Message m;
    m.id = "pay-" + run + "-" + std::to_string(i);
    const int64_t cents = 100 + static_cast<int64_t>(rng() % 100'000);
    m.payload = "order-" + std::to_string(i) + ":" + std::to_string(cents);
    m.producer_time_ms = Env::Default()->NowMs();
    expected_cents += cents;
    const int copies = (static_cast<double>(rng() % 1'000'000) / 1e6) < dup ? 2 : 1;
    for (int k = 0; k < copies; ++k) {
      if (Status s = source->publish(m); !s.ok()) return Fail(cmd, s.WithContext("publish " + m.id));
      ++published;
    }
  }
  if (args.Bool("json")) {
    std::cout << Json().Add("messages", *n).Add("published", published).Add("expected_cents", expected_cents).str()
              << "\n";
  } else {
    std::cout << "published " << published << " deliveries of " << *n << " messages (" << expected_cents << " cents)\n";
  }
  return kExitOk;
}

}  // namespace idem::cli
