// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "long_running.h"

#if IDEM_HAVE_HTTP
#include "live/feed.h"
#include "live/web.h"
#endif

#include <chrono>
#include <cstdio>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "components.h"

namespace idem::cli {

#if IDEM_HAVE_HTTP
struct MetricsServer::Impl {
  std::unique_ptr<live::WebServer> web;
};
struct LiveView::Impl {
  std::unique_ptr<live::Feed> feed;
  std::unique_ptr<live::WebServer> web;
};
#else
struct MetricsServer::Impl {};
struct LiveView::Impl {};
#endif

namespace {
// --FLAG HOST:PORT, when given: OK, or why it cannot be served.
Status ValidateAddress(const Args& args, const std::string& flag, const char* what) {
  if (!args.Has(flag)) return Status::OK();
  const std::string at = args.Get(flag);
  if (!ParseHostPort(at)) return Status::InvalidArgument("--" + flag + " must be HOST:PORT, got '" + at + "'");
#if !IDEM_HAVE_HTTP
  return NotBuilt(std::string("--") + flag + " (" + what + ")", "IDEM_WITH_HTTP=ON -DIDEM_WITH_HTTPLIB");
#else
  (void)what;
  return Status::OK();
#endif
}
}  // namespace

Status MetricsServer::Validate(const Args& args) { return ValidateAddress(args, "metrics", "served over HTTP"); }

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Args& args, std::function<std::string()> render) {
  IDEM_RETURN_IF_ERROR(Validate(args));
  if (!args.Has("metrics")) return std::unique_ptr<MetricsServer>();
#if IDEM_HAVE_HTTP
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->impl_ = std::make_unique<Impl>();
  IDEM_ASSIGN_OR_RETURN(m->impl_->web,
                        live::WebServer::Start("metrics", args.Get("metrics"), nullptr, std::move(render)));
  return m;
#else
  return Status::Internal("unreachable");
#endif
}

MetricsServer::~MetricsServer() = default;

Status LiveView::Validate(const Args& args) { return ValidateAddress(args, "web", "the live view, served over HTTP"); }

Result<std::unique_ptr<LiveView>> LiveView::Start(const Args& args, std::string process,
                                                  std::function<std::string()> render) {
  IDEM_RETURN_IF_ERROR(Validate(args));
  if (!args.Has("web")) return std::unique_ptr<LiveView>();
#if IDEM_HAVE_HTTP
  std::unique_ptr<LiveView> v(new LiveView());
  v->impl_ = std::make_unique<Impl>();
  v->impl_->feed = std::make_unique<live::Feed>(std::move(process));
  const bool metrics = static_cast<bool>(render);
  IDEM_ASSIGN_OR_RETURN(v->impl_->web,
                        live::WebServer::Start("web", args.Get("web"), v->impl_->feed.get(), std::move(render)));
  const std::string& url = v->impl_->web->url();
  std::fprintf(stderr, "live view: %s (events: %sevents%s)\n", url.c_str(), url.c_str(),
               metrics ? (", metrics: " + url + "metrics").c_str() : "");
  return v;
#else
  (void)process;
  (void)render;
  return Status::Internal("unreachable");
#endif
}

LiveView::~LiveView() {
#if IDEM_HAVE_HTTP
  if (impl_) impl_->web.reset();  // before the feed it reads
#endif
}

Observer* LiveView::observer() {
#if IDEM_HAVE_HTTP
  return impl_ ? impl_->feed.get() : nullptr;
#else
  return nullptr;
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

}  // namespace idem::cli
