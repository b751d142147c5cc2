// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "long_running.h"

#if IDEM_HAVE_HTTP
#include <httplib.h>  // served by cpp-httplib
#endif

#include <chrono>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "components.h"

namespace idem::cli {

#if IDEM_HAVE_HTTP
struct MetricsServer::Impl {
  httplib::Server server;
  std::thread thread;
};
#else
struct MetricsServer::Impl {};
#endif

Status MetricsServer::Validate(const Args& args) {
  if (!args.Has("metrics")) return Status::OK();
  const std::string at = args.Get("metrics");
  if (!ParseHostPort(at)) return Status::InvalidArgument("--metrics must be HOST:PORT, got '" + at + "'");
#if !IDEM_HAVE_HTTP
  return NotBuilt("--metrics (served over HTTP)", "IDEM_WITH_HTTP=ON -DIDEM_WITH_HTTPLIB");
#else
  return Status::OK();
#endif
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Args& args, std::function<std::string()> render) {
  IDEM_RETURN_IF_ERROR(Validate(args));
  if (!args.Has("metrics")) return std::unique_ptr<MetricsServer>();
#if IDEM_HAVE_HTTP
  auto [host, port] = *ParseHostPort(args.Get("metrics"));
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->impl_ = std::make_unique<Impl>();
  m->impl_->server.Get("/metrics", [render = std::move(render)](const httplib::Request&, httplib::Response& res) {
    res.set_content(render(), "text/plain; version=0.0.4");
  });
  if (!m->impl_->server.bind_to_port(host, port))
    return Status::Unavailable("cannot serve metrics on " + args.Get("metrics") + " (in use?)");
  try {
    m->impl_->thread = std::thread([impl = m->impl_.get()] { impl->server.listen_after_bind(); });
  } catch (const std::system_error& e) {
    return Status::Unavailable(std::string("cannot start the metrics thread: ") + e.what());
  }
  return m;
#else
  return Status::Internal("unreachable");
#endif
}

MetricsServer::~MetricsServer() {
#if IDEM_HAVE_HTTP
  if (impl_ && impl_->thread.joinable()) {
    impl_->server.stop();
    impl_->thread.join();
  }
#endif
}

Result<std::unique_ptr<ProgressLines>> ProgressLines::Start(std::function<void()> line) {
  std::unique_ptr<ProgressLines> p(new ProgressLines());
  try {
    p->thread_ = std::thread([self = p.get(), line = std::move(line)] {
      while (!self->done_.load()) {
        for (int i = 0; i < 50 && !self->done_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!self->done_.load()) line();
      }
    });
  } catch (const std::system_error& e) {
    return Status::Unavailable(std::string("cannot start the progress thread: ") + e.what());
  }
  return p;
}

ProgressLines::~ProgressLines() {
  done_ = true;
  if (thread_.joinable()) thread_.join();
}

namespace {
std::atomic<OutboxRelay*> g_signal_relay{nullptr};
void StopRelay(int) {
  if (OutboxRelay* r = g_signal_relay.load()) r->Stop();
}
}  // namespace

RelayStopOnSignals::RelayStopOnSignals(OutboxRelay& relay) {
  g_signal_relay = &relay;
  struct sigaction sa {};
  sa.sa_handler = StopRelay;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

RelayStopOnSignals::~RelayStopOnSignals() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  g_signal_relay = nullptr;
}

}  // namespace idem::cli
