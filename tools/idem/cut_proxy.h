// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// A TCP proxy on 127.0.0.1 that `idem chaos` puts between the consumer
// processes and their database, so that it can cut the network between them:
// Cut() resets every connection through it (RST, as a dropped link or a
// firewall would) and refuses new ones for a while (an outage). Works without
// privileges or network namespaces; the processes under test see exactly what
// a cut link gives them: reads and writes failing mid-transaction, then
// connection refused until the outage ends.
#ifndef IDEM_TOOLS_IDEM_CUT_PROXY_H_
#define IDEM_TOOLS_IDEM_CUT_PROXY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "idem/result.h"

namespace idem::cli {

class CutProxy {
 public:
  // Listens on 127.0.0.1 (any free port) and forwards to host:port.
  static Result<std::unique_ptr<CutProxy>> Start(const std::string& host, int port);
  ~CutProxy();  // stops and closes everything
  CutProxy(const CutProxy&) = delete;
  CutProxy& operator=(const CutProxy&) = delete;

  int port() const { return port_; }
  // Resets every open connection and refuses new ones for `outage_ms`.
  void Cut(int64_t outage_ms);
  // From now on, the first bytes of a response (what the target sends after
  // the client sent something) are, for a `rate` share of responses drawn
  // from `seed`, not passed on: both sides of that connection are reset
  // instead. 0 turns it off.
  void LoseResponses(double rate, uint64_t seed);
  int64_t responses_lost() const { return lost_.load(); }
  int64_t cuts() const { return cuts_.load(); }
  int64_t connections_reset() const { return reset_.load(); }

 private:
  CutProxy(int listen_fd, int port, std::string host, int target_port);
  void Loop();

  int listen_fd_;
  int port_;
  std::string host_;
  int target_port_;
  int wake_[2] = {-1, -1};  // a pipe: Cut() and the destructor wake the loop
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> cut_requests_{0};
  std::atomic<int64_t> outage_ms_{0};
  std::atomic<int64_t> cuts_{0}, reset_{0}, lost_{0};
  std::atomic<double> lose_rate_{0};
  std::atomic<uint64_t> lose_seed_{0};
  std::thread thread_;
};

// `url` (postgres://user@host:port/db?...) with host:port replaced by
// 127.0.0.1:port; `host` and `target` get what it named (default port 5432).
Result<std::string> RouteThrough(const std::string& url, int port, std::string& host, int& target);
// Every host:port `url` names (a multi-host URL names several, comma-
// separated) routed through a proxy of its own: `route(host, port)` starts
// one and gives its port; the URL returned names those ports in the same
// order (libpq tries them in turn, as it would the servers).
Result<std::string> RouteEachThrough(const std::string& url,
                                     const std::function<Result<int>(const std::string& host, int port)>& route);

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_CUT_PROXY_H_
