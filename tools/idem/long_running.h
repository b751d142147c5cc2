// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The parts of the long-running commands (idem run, idem relay): --metrics
// HOST:PORT, where GET /metrics answers the Prometheus text a callback
// renders, and a progress line on stderr every 5 s; each on a thread of its
// own until it is destroyed.
#ifndef IDEM_TOOLS_IDEM_LONG_RUNNING_H_
#define IDEM_TOOLS_IDEM_LONG_RUNNING_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "cli.h"
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
