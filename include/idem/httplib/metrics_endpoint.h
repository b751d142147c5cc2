// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Prometheus metrics over HTTP for a service that has no server of its own:
// GET /metrics answers idem::Metrics::Render() (idem/metrics.h).
//
//   idem::Metrics metrics;   // the observer of your Inbox, Outbox, relay, Claims
//   auto endpoint = idem::httplib::MetricsEndpoint::Open(metrics, {.port = 9464});
//   // ... until `endpoint` is destroyed, curl 127.0.0.1:9464/metrics
//
// A service with a cpp-httplib server of its own mounts the route on it
// instead: idem::httplib::MountMetrics(server, metrics).
//
// Thread safety: Render is called on the endpoint's threads while your
// threads count; the Metrics must outlive the endpoint.
#ifndef IDEM_HTTPLIB_METRICS_ENDPOINT_H_
#define IDEM_HTTPLIB_METRICS_ENDPOINT_H_

#include <httplib.h>

#include <memory>
#include <string>
#include <thread>

#include "idem/http/idempotency.h"
#include "idem/metrics.h"
#include "idem/result.h"

namespace idem::httplib {

// GET `path` on `server` answers metrics.Render() in the Prometheus text format.
void MountMetrics(::httplib::Server& server, const Metrics& metrics, const std::string& path = "/metrics");

// GET `path` on `server` answers the Idempotency-Key middleware's counters
// and request-latency histograms by outcome (http::Idempotency::Metrics),
// after metrics->Render() when `metrics` is not null. Both must outlive the
// server.
//
//   idem::httplib::MountMetrics(server.native(), **idempotency, &metrics);
void MountMetrics(::httplib::Server& server, const http::Idempotency& idempotency, const Metrics* metrics = nullptr,
                  const std::string& path = "/metrics");

// cpp-httplib 0.11 binds with SO_REUSEPORT, so a second server on a port in
// use shares it silently: this sets SO_REUSEADDR alone, and binding a port
// in use fails. MetricsEndpoint does it; call it on a server of yours before
// binding.
void NoSharedPort(::httplib::Server& server);

class MetricsEndpoint {
 public:
  struct Options {
    // Where to listen. Default: loopback only (the text has no
    // authentication; bind elsewhere behind your own controls).
    std::string host = "127.0.0.1";
    // 0: any free port (see port()). Default: 9464, Prometheus' usual
    // exporter port.
    int port = 9464;
    std::string path = "/metrics";
  };
  // Binds and serves on a thread of its own until destroyed.
  // kInvalidArgument for a port outside 0..65535 or a path not starting
  // with '/'; kUnavailable when the address cannot be bound.
  static Result<std::unique_ptr<MetricsEndpoint>> Open(const Metrics& metrics, const Options& options);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;
  ::httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace idem::httplib

#endif  // IDEM_HTTPLIB_METRICS_ENDPOINT_H_
