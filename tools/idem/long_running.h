// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The parts of the long-running commands (idem run, idem relay): --metrics
// HOST:PORT, where GET /metrics answers the Prometheus text a callback
// renders, and a progress line on stderr every 5 s; each on a thread of its
// own until it is destroyed; and a relay's stop on SIGINT/SIGTERM.
#ifndef IDEM_TOOLS_IDEM_LONG_RUNNING_H_
#define IDEM_TOOLS_IDEM_LONG_RUNNING_H_

#include <signal.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "cli.h"
#include "idem/observer.h"
#include "idem/outbox_relay.h"
#include "idem/result.h"

namespace idem::cli {

class MetricsServer {
 public:
  // Checks --metrics: kInvalidArgument when it is not HOST:PORT, or when this
  // idem was built without HTTP.
  static Status Validate(const Args& args);
  // Serves `render` on --metrics; null when the flag is absent. kUnavailable
  // when the port cannot be bound or the thread cannot start.
  static Result<std::unique_ptr<MetricsServer>> Start(const Args& args, std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

 private:
  MetricsServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --web HOST:PORT: the live view of this process's events (a page that
// animates them, tools/idem/live/), with GET /metrics beside it.
class LiveView {
 public:
  // Checks --web: kInvalidArgument when it is not HOST:PORT, or when this
  // idem was built without HTTP.
  static Status Validate(const Args& args);
  // Serves the view on --web; null when the flag is absent. `process` names
  // this process on the page. kUnavailable when the port cannot be bound.
  static Result<std::unique_ptr<LiveView>> Start(const Args& args, std::string process,
                                                 std::function<std::string()> render);
  ~LiveView();
  LiveView(const LiveView&) = delete;
  LiveView& operator=(const LiveView&) = delete;
  // What the view is fed by: set it as (one of) the library's observers.
  Observer* observer();

 private:
  LiveView() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Calls `line` every 5 s (it prints one progress line) until destroyed.
class ProgressLines {
 public:
  // kUnavailable when the thread cannot start.
  static Result<std::unique_ptr<ProgressLines>> Start(std::function<void()> line);
  ~ProgressLines();
  ProgressLines(const ProgressLines&) = delete;
  ProgressLines& operator=(const ProgressLines&) = delete;

 private:
  ProgressLines() = default;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_LONG_RUNNING_H_
