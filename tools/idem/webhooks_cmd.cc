// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem webhooks: a webhook receiver that verifies, deduplicates and enqueues
// (idem/http/webhook.h), or, with --sign, the headers a sender would send.
#include <httplib.h>
#include <signal.h>

#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>

#include "cli.h"
#include "commands.h"
#include "idem/http/webhook.h"
#include "idem/httplib/metrics_endpoint.h"
#include "idem/httplib/middleware.h"
#include "idem/metrics.h"
#include "idem/url.h"
#include "sources.h"

namespace idem::cli {

const Command& WebhooksCommand() {
  static const Command c{
      "webhooks",
      "Receive webhooks: POST <path> verifies the sender's signature over the raw body (--scheme standard:\n"
      "Standard Webhooks v1/v1a; github: X-Hub-Signature-256; stripe: Stripe-Signature), then puts each new\n"
      "event on --to (any source URL's publisher: embedded:queue.db?queue=webhooks, redis://...) with the\n"
      "event id as the message id, and answers 200 once its marker is committed in --store. A retry of an\n"
      "event answers 200 and enqueues nothing; the same id with another body 422; a bad signature 401 and a\n"
      "request that is not a webhook 400, with nothing stored. GET /metrics serves Prometheus counters.\n"
      "Markers older than --retention are purged hourly. Stops on SIGINT/SIGTERM.\n"
      "With --sign: print the headers a sender would send with --body (one 'Name: value' per line, or\n"
      "--json), for curl -H and for tests.",
      "--secret SECRET [--secret ...] --to URL [--scheme standard|github|stripe] [--listen HOST:PORT]\n"
      "       [--path /webhooks] [--store URL] [--retention DURATION] [--tolerance DURATION] [--group-commit N]\n"
      "       [--quiet]\n"
      "   or: --sign --secret SECRET --body TEXT [--id ID] [--scheme ...] [--json]",
      {{"secret", "SECRET", "",
        "a secret that may sign (repeatable: rotation): whsec_... or whpk_... (standard),\n"
        "          the webhook secret (github), the endpoint secret whsec_... (stripe)",
        true},
       {"scheme", "NAME", "standard", "the sender's signature scheme: standard, github or stripe"},
       {"to", "URL", "", "where events go: a source URL (its publisher)"},
       {"listen", "HOST:PORT", "127.0.0.1:8090", "address to serve on"},
       {"path", "PATH", "/webhooks", "the path senders POST to"},
       {"store", "URL", "sqlite:idem-webhooks.db", "where the events' markers are kept"},
       {"consumer", "NAME", "webhooks", "the markers' consumer name"},
       {"retention", "DURATION", "7d", "how long an event id is remembered (the senders' retry horizon)"},
       {"tolerance", "DURATION", "5m", "how far a signed timestamp may be from now"},
       {"group-commit", "N", "16", "events handled together in one transaction at most (0: one each)"},
       {"quiet", "", "", "no per-request log lines"},
       {"sign", "", "", "print the headers for --body instead of serving"},
       {"body", "TEXT", "", "with --sign: the body to sign"},
       {"id", "ID", "", "with --sign: the event id (default: msg_ and the body's fingerprint)"},
       {"json", "", "", "with --sign: the headers as one JSON object"}}};
  return c;
}

namespace {

int Sign(const Args& args, http::WebhookScheme scheme, const std::vector<std::string>& secrets) {
  const std::string cmd = "webhooks";
  if (!args.Has("body")) return Fail(cmd, Status::InvalidArgument("--sign needs --body"));
  const std::string body = args.Get("body");
  std::string id = args.Get("id");
  if (id.empty()) id = "msg_" + ToHex(FingerprintOf(body)).substr(0, 24);
  auto headers = http::SignWebhook(scheme, secrets[0], id, Env::Default()->NowMs() / 1000, body);
  if (!headers.ok()) return Fail(cmd, headers.status());
  if (args.Bool("json")) {
    std::string out = "{";
    for (const auto& [name, value] : *headers) {
      out += (out.size() > 1 ? "," : "") + JsonString(name) + ":" + JsonString(value);
    }
    std::cout << out << "}\n";
  } else {
    for (const auto& [name, value] : *headers) std::cout << name << ": " << value << "\n";
  }
  return kExitOk;
}

}  // namespace

int RunWebhooks(const Args& args) {
  const std::string cmd = "webhooks";
  auto scheme = http::ParseWebhookScheme(args.Get("scheme"));
  if (!scheme.ok()) return Fail(cmd, scheme.status());
  const std::vector<std::string> secrets = args.GetAll("secret");
  if (secrets.empty()) return Fail(cmd, Status::InvalidArgument("--secret is required"));
  if (args.Bool("sign")) return Sign(args, *scheme, secrets);
  if (!args.Has("to")) return Fail(cmd, Status::InvalidArgument("--to is required (where events go)"));
  const auto host_port = ListenFlag(args);
  if (!host_port.ok()) return Fail(cmd, host_port.status());
  const std::string listen = args.Get("listen");
  const std::string path = args.Get("path");
  if (path.empty() || path[0] != '/' || path == "/metrics")
    return Fail(cmd, Status::InvalidArgument("--path must start with / and not be /metrics, got '" + path + "'"));
  auto retention = ParseDurationMs(args.Get("retention"));
  auto tolerance = ParseDurationMs(args.Get("tolerance"));
  for (const auto* r : {&retention, &tolerance})
    if (!r->ok()) return Fail(cmd, r->status());
  auto group = args.GetInt("group-commit", 0, 10'000);
  if (!group.ok()) return Fail(cmd, group.status());
  // Signals go to this thread's sigwait, never to a thread the store, the
  // publisher or the server starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto publisher = OpenPublisherFlag("to", args.Get("to"));
  if (!publisher.ok()) return Fail(cmd, publisher.status());
  auto store = OpenStore(args.Get("store"));
  if (!store.ok()) return Fail(cmd, store.status());
  Metrics metrics;
  auto receiver =
      http::WebhookReceiver::Open(**store, **publisher,
                                  {.verify = {.scheme = *scheme, .secrets = secrets, .tolerance_ms = *tolerance},
                                   .consumer = args.Get("consumer"),
                                   .retention_ms = *retention,
                                   .observer = &metrics,
                                   .group_commit_max = static_cast<int>(*group)});
  if (!receiver.ok()) return Fail(cmd, receiver.status());

  const bool quiet = args.Bool("quiet");
  std::mutex log_mu;
  ::httplib::Server server;
  idem::httplib::NoSharedPort(server);
  server.Post(path, [&](const ::httplib::Request& req, ::httplib::Response& res) {
    http::Answer a = (*receiver)->Handle(idem::httplib::ToRequest(req));
    idem::httplib::WriteAnswer(a, res);
    if (!quiet) {
      std::lock_guard<std::mutex> l(log_mu);
      std::cerr << "idem webhooks: " << a.status << " " << a.body << "\n";
    }
  });
  idem::httplib::MountMetrics(server, metrics);
  if (!server.bind_to_port(host_port->first, host_port->second)) {
    return Fail(cmd,
                Status::Unavailable("cannot listen on " + listen + " (in use, or not an address of this machine)"));
  }
  std::thread serving([&] { server.listen_after_bind(); });
  // Forget event ids past their retention, hourly (and once at start).
  std::mutex purge_mu;
  std::condition_variable purge_cv;
  bool stopping = false;
  std::thread purger([&] {
    std::unique_lock<std::mutex> l(purge_mu);
    do {
      auto n = (*receiver)->Purge();
      if (!n.ok()) std::cerr << "idem webhooks: purge failed: " << n.status() << "\n";
    } while (!purge_cv.wait_for(l, std::chrono::hours(1), [&] { return stopping; }));
  });
  std::cerr << "idem webhooks: serving POST http://" << listen << path << " (" << args.Get("scheme") << ", to "
            << RedactUrl(args.Get("to")) << ", store " << RedactUrl(args.Get("store")) << ")\n";
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cerr << "idem webhooks: stopping on signal " << sig << "\n";
  server.stop();
  serving.join();
  {
    std::lock_guard<std::mutex> l(purge_mu);
    stopping = true;
  }
  purge_cv.notify_all();
  purger.join();
  const http::WebhookCounters c = (*receiver)->counters();
  std::cerr << "idem webhooks: applied " << c.applied << ", replayed " << c.replayed << ", conflicts " << c.conflicts
            << ", unverified " << c.unverified << ", malformed " << c.malformed << ", failed " << c.failed << "\n";
  return kExitOk;
}

}  // namespace idem::cli
