// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem relay: publishes a store's outbox (idem/outbox_relay.h) to a broker,
// with Prometheus metrics and progress lines.
#include <atomic>
#include <cstdio>
#include <iostream>
#include <string>

#include "commands.h"
#include "idem/metrics.h"
#include "idem/outbox.h"
#include "idem/outbox_relay.h"
#include "idem/url.h"
#include "long_running.h"
#include "sources.h"

namespace idem::cli {
namespace {

std::string StatsJson(const std::string& to, const OutboxRelayStats& s) {
  return Json()
      .Add("to", RedactUrl(to))
      .Add("published", s.published)
      .Add("republished", s.republished)
      .Add("dead_lettered", s.dead_lettered)
      .Add("transient_errors", s.transient_errors)
      .Add("rounds", s.rounds)
      .Add("lanes", s.lanes)
      .Add("backlog", s.backlog)
      .Add("oldest_unsent_age_ms", s.oldest_unsent_age_ms)
      .Add("store_seconds", static_cast<double>(s.store_us) / 1e6)
      .Add("publish_seconds", static_cast<double>(s.publish_us) / 1e6)
      .str();
}

}  // namespace

const Command& RelayCommand() {
  static const Command c{
      "relay",
      "Publish the outbox of --store to --to: each message committed by Outbox::Add is published and\n"
      "recorded as sent only after the broker confirmed it (at least once: a crash in between publishes it\n"
      "again with the same id, which the next consumer's inbox drops); messages with one ordering key\n"
      "in commit order. Several relays on one store share the work (the others wait as hot standbys on\n"
      "SQLite). Destinations (those this build has): " +
          KnownSources() +
          "; a URL without its queue, stream or topic\n"
          "publishes each message to its own destination. Prometheus metrics on --metrics HOST:PORT; the live\n"
          "view (a page animating what the relay publishes, with /metrics) on --web HOST:PORT; a progress\n"
          "line on stderr every 5 s. Stops on SIGINT/SIGTERM (after the round in flight), or once the\n"
          "outbox is empty with --drain.",
      "--to URL [--store URL] [--name NAME] [--batch N] [--poll DURATION] [--keep-sent true|false]\n"
      "       [--max-attempts N] [--drain] [--metrics HOST:PORT] [--web HOST:PORT] [--json]",
      {{"to", "URL", "", "where to publish (embedded:PATH, redis://..., amqp://..., kafka://...)"},
       {"store", "URL", "sqlite:idem.db", "the store holding the outbox (sqlite:PATH or postgres://...)"},
       {"name", "NAME", "relay", "this relay's name (idem inspect, metrics)"},
       {"batch", "N", "500", "messages fetched per round, 1..10000"},
       {"poll", "DURATION", "500", "while idle, how long to wait for a wake-up before looking again (ms, 1s, ...)"},
       {"keep-sent", "BOOL", "true", "keep sent messages for retention (idem purge) or delete them at once"},
       {"max-attempts", "N", "0", "transient failures of a message before it is dead-lettered; 0: forever"},
       {"drain", "", "", "return once the outbox is empty"},
       {"metrics", "HOST:PORT", "", "serve Prometheus metrics on GET /metrics"},
       {"web", "HOST:PORT", "", "serve the live view on GET / (events on /events, metrics on /metrics)"},
       {"json", "", "", "print the final counters as one JSON object"}}};
  return c;
}

int RunRelay(const Args& args) {
  const std::string cmd = "relay";
  if (!args.Has("to")) return Fail(cmd, Status::InvalidArgument("--to is required"));
  auto batch = args.GetInt("batch", 1, 10'000);
  if (!batch.ok()) return Fail(cmd, batch.status());
  auto attempts = args.GetInt("max-attempts", 0, 1'000'000);
  if (!attempts.ok()) return Fail(cmd, attempts.status());
  auto poll = ParseDurationMs(args.Get("poll"));
  if (!poll.ok()) return Fail(cmd, poll.status());
  if (*poll < 1) return Fail(cmd, Status::InvalidArgument("--poll must be at least 1 ms"));
  const std::string keep = args.Get("keep-sent");
  if (keep != "true" && keep != "false")
    return Fail(cmd, Status::InvalidArgument("--keep-sent must be true or false, got '" + keep + "'"));
  if (Status s = MetricsServer::Validate(args); !s.ok()) return Fail(cmd, s);
  if (Status s = LiveView::Validate(args); !s.ok()) return Fail(cmd, s);
  const std::string to = args.Get("to");
  auto publisher = OpenPublisherFlag("to", to);
  if (!publisher.ok()) return Fail(cmd, publisher.status());
  auto store = OpenStore(args.Get("store"), false);
  if (!store.ok()) return Fail(cmd, store.status());
  // --metrics: the relay's events counted by idem::Metrics (the library's
  // registry), and its state as gauges.
  Metrics registry;
  auto view = LiveView::Start(args, "idem relay", [&] { return registry.Render(); });
  if (!view.ok()) return Fail(cmd, view.status());
  Observers observers({&registry, *view ? (*view)->observer() : nullptr});
  auto relay_owned = OutboxRelay::Open(**store, **publisher,
                                       {.name = args.Get("name"),
                                        .batch = static_cast<int>(*batch),
                                        .poll_ms = *poll,
                                        .keep_sent = keep == "true",
                                        .max_attempts = static_cast<int>(*attempts),
                                        .stop_when_idle = args.Bool("drain"),
                                        .observer = &observers});
  if (!relay_owned.ok()) return Fail(cmd, relay_owned.status());
  OutboxRelay& relay = **relay_owned;
  const std::string name = args.Get("name");
  const std::string labels = "relay=\"" + name + "\"";
  registry.AddGauge("idem_outbox_backlog", "Unsent outbox messages seen by the last fetch (at most --batch).", labels,
                    [&] { return static_cast<double>(relay.stats().backlog); });
  registry.AddGauge("idem_outbox_oldest_unsent_age_seconds",
                    "Age of the oldest unsent outbox message at the last fetch (0: none).", labels,
                    [&] { return static_cast<double>(relay.stats().oldest_unsent_age_ms) / 1000; });
  registry.AddGauge("idem_outbox_lanes_held", "Outbox lanes this relay holds (0: standby).", labels,
                    [&] { return static_cast<double>(relay.stats().lanes); });
  auto metrics = MetricsServer::Start(args, [&] { return registry.Render(); });
  if (!metrics.ok()) return Fail(cmd, metrics.status());
  uint64_t last = 0;
  auto progress = ProgressLines::Start([&] {
    OutboxRelayStats s = relay.stats();
    std::fprintf(stderr,
                 "idem relay: %llu published (%llu republished), %llu dead-lettered, %llu transient errors, "
                 "backlog %lld, %d lane(s) (+%llu in 5 s)\n",
                 static_cast<unsigned long long>(s.published), static_cast<unsigned long long>(s.republished),
                 static_cast<unsigned long long>(s.dead_lettered), static_cast<unsigned long long>(s.transient_errors),
                 static_cast<long long>(s.backlog), s.lanes, static_cast<unsigned long long>(s.published - last));
    last = s.published;
  });
  if (!progress.ok()) return Fail(cmd, progress.status());
  StopOnSignals(&relay);
  const Status s = relay.Run();
  StopOnSignals(nullptr);  // SIGINT and SIGTERM as they were
  progress->reset();
  metrics->reset();
  const OutboxRelayStats st = relay.stats();
  if (args.Bool("json")) {
    std::cout << StatsJson(to, st) << "\n";
  } else {
    std::cout << "published " << st.published << " (" << st.republished << " republished), dead-lettered "
              << st.dead_lettered << ", transient errors " << st.transient_errors << "\n";
  }
  if (!s.ok()) return Fail(cmd, s);
  return kExitOk;
}

}  // namespace idem::cli
