// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The HTTP side of a long-running idem command: GET /metrics (the
// Prometheus text a callback renders) and, with a live Feed, the live view:
//   GET /         the page (tools/idem/live/index.html, compiled in)
//   GET /events   server-sent events: a snapshot, then batches (feed.h)
//   GET /state    the snapshot as JSON (for scripts and tests)
// On a thread pool of its own until destroyed. Bound to HOST:PORT as given
// (127.0.0.1 by default in the commands' help).
#ifndef IDEM_TOOLS_IDEM_LIVE_WEB_H_
#define IDEM_TOOLS_IDEM_LIVE_WEB_H_

#include <functional>
#include <memory>
#include <string>

#include "idem/result.h"
#include "live/feed.h"

namespace idem::cli::live {

class WebServer {
 public:
  // `at` is HOST:PORT (flag names it in errors); `feed` may be null (only
  // /metrics); `render` may be empty (no /metrics). kInvalidArgument for a
  // malformed address, kUnavailable when the port cannot be bound.
  static Result<std::unique_ptr<WebServer>> Start(const std::string& flag, const std::string& at, Feed* feed,
                                                  std::function<std::string()> render);
  ~WebServer();
  WebServer(const WebServer&) = delete;
  WebServer& operator=(const WebServer&) = delete;
  // http://HOST:PORT/
  const std::string& url() const { return url_; }

 private:
  WebServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string url_;
};

// The page, compiled in (live_page.cc, made from index.html by CMake).
extern const char* const kLivePage;

}  // namespace idem::cli::live

#endif  // IDEM_TOOLS_IDEM_LIVE_WEB_H_
