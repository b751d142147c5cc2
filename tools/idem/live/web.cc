// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "live/web.h"

#include <httplib.h>

#include "idem/httplib/metrics_endpoint.h"

#include <chrono>
#include <system_error>
#include <thread>

#include "cli.h"

namespace idem::cli::live {

namespace {

// What one page's /events connection has been sent.
struct Stream {
  bool started = false;
  Cursor cursor;
};

// At most this many events per batch, and a batch at most every
// kBatchEveryMs: a flood is coalesced for the page, never waited for.
constexpr size_t kMaxPerBatch = 300;
constexpr int64_t kBatchEveryMs = 100;

}  // namespace

struct WebServer::Impl {
  ::httplib::Server server;
  std::thread thread;
  Feed* feed = nullptr;
};

Result<std::unique_ptr<WebServer>> WebServer::Start(const std::string& flag, const std::string& at, Feed* feed,
                                                    std::function<std::string()> render) {
  auto hp = ParseHostPort(at);
  if (!hp) return Status::InvalidArgument("--" + flag + " must be HOST:PORT, got '" + at + "'");
  std::unique_ptr<WebServer> w(new WebServer());
  w->impl_ = std::make_unique<Impl>();
  Impl& impl = *w->impl_;
  impl.feed = feed;
  idem::httplib::NoSharedPort(impl.server);  // a port in use is an error, not shared
  // Every open page holds a connection for its event stream.
  impl.server.new_task_queue = [] { return new ::httplib::ThreadPool(16); };
  if (render) {
    impl.server.Get("/metrics", [render = std::move(render)](const ::httplib::Request&, ::httplib::Response& res) {
      res.set_content(render(), "text/plain; version=0.0.4");
    });
  }
  if (feed != nullptr) {
    impl.server.Get("/", [](const ::httplib::Request&, ::httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      res.set_content(kLivePage, "text/html; charset=utf-8");
    });
    impl.server.Get("/state", [feed](const ::httplib::Request&, ::httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      res.set_content(feed->Snapshot(), "application/json");
    });
    impl.server.Get("/events", [feed](const ::httplib::Request&, ::httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      auto stream = std::make_shared<Stream>();
      res.set_chunked_content_provider("text/event-stream", [feed, stream](size_t, ::httplib::DataSink& sink) {
        std::string msg;
        if (!stream->started) {
          stream->started = true;
          msg = "retry: 1000\nevent: snapshot\ndata: " + feed->Snapshot(&stream->cursor) + "\n\n";
        } else {
          const std::string batch = feed->Batch(&stream->cursor, 1'000, kMaxPerBatch);
          msg = batch.empty() ? std::string(": idle\n\n") : "event: batch\ndata: " + batch + "\n\n";
        }
        if (!sink.write(msg.data(), msg.size())) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(kBatchEveryMs));
        return true;
      });
    });
  }
  if (!impl.server.bind_to_port(hp->first, hp->second))
    return Status::Unavailable("cannot serve on --" + flag + " " + at + " (in use?)");
  w->url_ = "http://" + hp->first + ":" + std::to_string(hp->second) + "/";
  try {
    impl.thread = std::thread([&impl] { impl.server.listen_after_bind(); });
  } catch (const std::system_error& e) {
    return Status::Unavailable(std::string("cannot start the --") + flag + " server's thread: " + e.what());
  }
  // Serving before it is returned: a stop() before the listen began would
  // not end it.
  while (!impl.server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return w;
}

WebServer::~WebServer() {
  if (!impl_) return;
  if (impl_->feed != nullptr) impl_->feed->Close();
  if (impl_->thread.joinable()) {
    impl_->server.stop();
    impl_->thread.join();
  }
}

}  // namespace idem::cli::live
