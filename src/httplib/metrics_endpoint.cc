// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/httplib/metrics_endpoint.h"

#include <chrono>
#include <system_error>

namespace idem::httplib {

void NoSharedPort(::httplib::Server& server) {
  server.set_socket_options([](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
}

void MountMetrics(::httplib::Server& server, const Metrics& metrics, const std::string& path) {
  server.Get(path, [&metrics](const ::httplib::Request&, ::httplib::Response& res) {
    res.set_content(metrics.Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
}

void MountMetrics(::httplib::Server& server, const http::Idempotency& idempotency, const Metrics* metrics,
                  const std::string& path) {
  server.Get(path, [&idempotency, metrics](const ::httplib::Request&, ::httplib::Response& res) {
    res.set_content((metrics != nullptr ? metrics->Render() : std::string()) + idempotency.Metrics(),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Open(const Metrics& metrics, const Options& options) {
  if (options.port < 0 || options.port > 65535)
    return Status::InvalidArgument("MetricsEndpoint::Options::port must be 0..65535, got " +
                                   std::to_string(options.port));
  if (options.path.empty() || options.path[0] != '/')
    return Status::InvalidArgument("MetricsEndpoint::Options::path must start with '/', got '" + options.path + "'");
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  NoSharedPort(e->server_);
  MountMetrics(e->server_, metrics, options.path);
  if (options.port == 0) {
    e->port_ = e->server_.bind_to_any_port(options.host);
    if (e->port_ <= 0) return Status::Unavailable("cannot serve metrics on " + options.host + ": no free port");
  } else {
    if (!e->server_.bind_to_port(options.host, options.port))
      return Status::Unavailable("cannot serve metrics on " + options.host + ":" + std::to_string(options.port) +
                                 " (in use?)");
    e->port_ = options.port;
  }
  try {
    e->thread_ = std::thread([server = &e->server_] { server->listen_after_bind(); });
  } catch (const std::system_error& err) {
    return Status::Unavailable(std::string("cannot start the metrics endpoint's thread: ") + err.what());
  }
  // Serving before it is returned: a stop() before the listen began would
  // not end it.
  while (!e->server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (thread_.joinable()) {
    server_.stop();
    thread_.join();
  }
}

}  // namespace idem::httplib
