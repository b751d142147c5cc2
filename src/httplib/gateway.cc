// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The gateway: the Idempotency-Key middleware (one two-phase route whose
// handler forwards to the upstream) over idem::httplib::Server, the upstream
// reached over http/pool.h's connections.
#include "idem/httplib/gateway.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/options_check.h"
#include "http/latency.h"
#include "http/pool.h"
#include "idem/http/idempotency.h"
#include "idem/httplib/middleware.h"
#include "idem/message.h"

namespace idem::httplib {
namespace {

namespace hi = idem::http_internal;

// Headers of one hop (RFC 9110 7.6.1) and cpp-httplib's own pseudo headers:
// never forwarded either way.
bool HopByHop(std::string_view name) {
  static const char* const kSkip[] = {
      "connection", "keep-alive",  "proxy-connection",    "transfer-encoding",  "te",
      "trailer",    "upgrade",     "proxy-authorization", "proxy-authenticate", "content-length",
      "host",       "remote_addr", "remote_port",         "local_addr",         "local_port"};
  return std::any_of(std::begin(kSkip), std::end(kSkip),
                     [&](const char* s) { return http::EqualsIgnoringCase(name, s); });
}

// A connection idle longer is not reused: upstreams close idle connections
// after a few seconds (gunicorn 2 s, Node and cpp-httplib 5 s), and one
// closed just as a request goes out turns that request into an unknown
// outcome.
constexpr int64_t kUpstreamIdleMs = 1'000;

// The outcomes the latency histogram is labelled by.
enum Outcome { kForwarded, kReplayed, kConflict, kInProgress, kUnknown, kRefused, kPassed, kUpstreamError, kOutcomes };
constexpr std::string_view kOutcomeNames[kOutcomes] = {"forwarded",       "replayed", "conflict", "in_progress",
                                                       "outcome_unknown", "refused",  "passed",   "upstream_error"};

// A guarded request's body over max_body_bytes: its bytes in an unlinked
// temporary file (gone with the descriptor) and their SHA-256, computed as
// they arrive.
class Spool {
 public:
  Spool() = default;
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;
  ~Spool() {
    if (fd_ >= 0) ::close(fd_);
    if (sha_ != nullptr) EVP_MD_CTX_free(sha_);
  }
  // Makes the file in `dir` ("" : $TMPDIR, else /tmp); false (with `why`)
  // when it cannot be made.
  bool Open(std::string dir, std::string& why) {
    if (dir.empty()) dir = std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp";
    std::string path = dir + "/idem-gateway-body-XXXXXX";
    fd_ = ::mkstemp(path.data());
    if (fd_ < 0) {
      why = "cannot make a spool file in " + dir + ": " + std::strerror(errno);
      return false;
    }
    ::unlink(path.c_str());
    sha_ = EVP_MD_CTX_new();
    if (sha_ == nullptr || EVP_DigestInit_ex(sha_, EVP_sha256(), nullptr) != 1) {
      why = "cannot hash the spooled body";
      return false;
    }
    return true;
  }
  bool Write(const char* data, size_t n) {
    if (EVP_DigestUpdate(sha_, data, n) != 1) return false;
    for (size_t done = 0; done < n;) {
      const ssize_t w = ::write(fd_, data + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      done += static_cast<size_t>(w);
    }
    size_ += n;
    return true;
  }
  // The SHA-256 of what was written, in hex (call once, after the last Write).
  std::string Sha256() {
    Fingerprint fp{};
    unsigned int len = 0;
    EVP_DigestFinal_ex(sha_, fp.data(), &len);
    return ToHex(fp);
  }
  size_t size() const { return size_; }
  // Sends [offset, offset + length) of the file to `sink`, a piece at a time.
  bool Provide(size_t offset, size_t length, ::httplib::DataSink& sink) const {
    char buf[64 * 1024];
    const ssize_t r = ::pread(fd_, buf, std::min(length, sizeof buf), static_cast<off_t>(offset));
    return r > 0 && sink.write(buf, static_cast<size_t>(r));
  }

 private:
  int fd_ = -1;
  EVP_MD_CTX* sha_ = nullptr;
  size_t size_ = 0;
};

// Where a forwarded request's body comes from: `req.body` (read whole, as
// cpp-httplib reads it), a spool file, or the client's connection itself
// (streamed straight through).
struct BodySource {
  const std::string* bytes = nullptr;
  const Spool* spool = nullptr;
  const ::httplib::ContentReader* stream = nullptr;
};

}  // namespace

struct Gateway::Impl {
  Options options;
  hi::BaseUrl url;
  std::unique_ptr<hi::ConnectionPool> pool;  // every forward: keep-alive connections
  std::unique_ptr<http::Idempotency> idempotency;
  const http::Idempotency::Route* route = nullptr;
  std::unique_ptr<Server> server;
  int port = 0;
  std::atomic<uint64_t> forwarded{0}, in_flight{0}, passed{0}, upstream_errors{0};
  hi::LatencyByOutcome latency{kOutcomeNames};
  std::atomic<uint64_t> purged{0}, purge_errors{0};
  // The purge timer (Options::purge_every_ms): its thread, and how to stop it.
  std::thread purger;
  std::mutex purge_mu;
  std::condition_variable purge_cv;
  bool stopping = false;

  ~Impl() {
    {
      std::lock_guard lock(purge_mu);
      stopping = true;
    }
    purge_cv.notify_all();
    if (purger.joinable()) purger.join();
  }

  Result<int64_t> Purge() {
    Claims& claims = *options.claims;
    const int64_t retention = claims.options().retention_ms;
    Result<int64_t> n = claims.store().PurgeClaims("", retention, 1000);
    if (n.ok()) {
      purged.fetch_add(static_cast<uint64_t>(*n), std::memory_order_relaxed);
    } else {
      purge_errors.fetch_add(1, std::memory_order_relaxed);
      if (options.log) options.log("purge of expired keys failed: " + n.status().ToString());
    }
    return n;
  }

  void PurgeEvery(int64_t every_ms) {
    std::unique_lock lock(purge_mu);
    while (!purge_cv.wait_for(lock, std::chrono::milliseconds(every_ms), [&] { return stopping; })) {
      lock.unlock();
      (void)Purge();
      lock.lock();
    }
  }
  http::RefusalWriter problems = http::ProblemJson("https://idem.dev/problems");

  bool Guarded(const ::httplib::Request& req) const {
    if (!options.methods.count(req.method)) return false;
    if (options.paths.empty()) return true;
    return std::any_of(options.paths.begin(), options.paths.end(), [&](const std::string& p) {
      if (req.path.compare(0, p.size(), p) != 0) return false;
      return req.path.size() == p.size() || p.back() == '/' || req.path[p.size()] == '/';
    });
  }

  // Sends `req` to the upstream on a keep-alive connection. Answered: `ans`
  // is the upstream's answer. Not answered: false, with `sent` (whether it
  // can have reached the upstream) and `why`. A kept connection the upstream
  // has closed is never sent on: cpp-httplib checks it first and connects
  // anew (ConnectionPool::Take), so only a failure to connect means "not sent",
  // and a request on a connection the upstream closes at that very moment
  // is "sent" (doc/gateway.md).
  bool Forward(const ::httplib::Request& req, const BodySource& body, http::Answer& ans, bool& sent, std::string& why) {
    hi::ConnectionPool& p = *pool;
    ::httplib::Request out;
    out.method = req.method;
    out.path = url.path + (req.target.empty() ? req.path : req.target);
    for (const auto& [k, v] : req.headers)
      if (!HopByHop(k)) out.headers.emplace(k, v);
    out.headers.emplace("Host", url.HostHeader());
    if (std::string remote = req.get_header_value("REMOTE_ADDR"); !remote.empty()) {
      std::string xff = req.get_header_value("X-Forwarded-For");
      out.headers.erase("X-Forwarded-For");
      out.headers.emplace("X-Forwarded-For", xff.empty() ? remote : xff + ", " + remote);
    }
    if (body.bytes != nullptr) {
      out.body = *body.bytes;
    } else if (body.spool != nullptr) {
      const Spool* spool = body.spool;
      out.content_length_ = spool->size();
      out.content_provider_ = [spool](size_t offset, size_t length, ::httplib::DataSink& sink) {
        return spool->Provide(offset, length, sink);
      };
    } else if (body.stream != nullptr) {
      // Each piece as it arrives from the client (cpp-httplib's sized or
      // chunked writes, as the request came).
      const ::httplib::ContentReader* stream = body.stream;
      out.is_chunked_content_provider_ = !req.has_header("Content-Length");
      out.content_length_ = static_cast<size_t>(req.get_header_value<uint64_t>("Content-Length"));
      out.content_provider_ = [stream, chunked = out.is_chunked_content_provider_](size_t, size_t,
                                                                                   ::httplib::DataSink& sink) {
        if (!(*stream)([&](const char* data, size_t n) { return sink.write(data, n); })) return false;
        if (chunked) sink.done();
        return true;
      };
    }
    hi::ConnectionPool::Connection c = p.Take();
    ::httplib::Result r = c->send(out);
    if (!r) {
      sent = !hi::FailedToConnect(r.error());
      why = p.Describe(r.error(), *c);
      return false;
    }
    p.GiveBack(std::move(c));
    ans = http::Answer();
    ans.status = r->status;
    for (const auto& [k, v] : r->headers)
      if (!HopByHop(k)) ans.headers.Add(k, v);
    ans.body = std::move(r->body);
    return true;
  }

  // The request did not reach the upstream: 502, in the middleware's
  // problem+json shape.
  void UpstreamDown(http::Answer& ans, const std::string& why) {
    upstream_errors.fetch_add(1, std::memory_order_relaxed);
    ans = http::Answer();
    ans.status = 502;
    ans.headers.Set("Retry-After", "1");
    problems(http::Refusal{.status = 502,
                           .type = "upstream-unavailable",
                           .title = "Upstream unavailable",
                           .detail = "the upstream could not be reached (" + why +
                                     "); nothing was sent: retry with the same key",
                           .retry = "same-key"},
             ans);
  }

  void Handle(const ::httplib::Request& req, ::httplib::Response& res) {
    Serve(req, res, BodySource{.bytes = &req.body}, nullptr);
  }

  // With max_spooled_body: a request whose body cpp-httplib has not read.
  // Unguarded, it is streamed straight to the upstream; guarded, it is read
  // here, in memory up to max_body_bytes and past that into a spool file
  // (up to max_spooled_body: else 413), then served as any other.
  void HandleReading(const ::httplib::Request& req, ::httplib::Response& res, const ::httplib::ContentReader& reader) {
    const bool has_body = req.has_header("Content-Length") || req.has_header("Transfer-Encoding");
    if (!Guarded(req)) {
      Serve(req, res, has_body ? BodySource{.stream = &reader} : BodySource{.bytes = &req.body}, nullptr);
      return;
    }
    std::string body, why;
    Spool spool;
    bool spooled = false, too_large = false, failed = false;
    const bool read = reader([&](const char* data, size_t n) {
      if (!spooled && body.size() + n <= options.max_body_bytes) {
        body.append(data, n);
        return true;
      }
      if (!spooled) {
        spooled = true;
        if (!spool.Open(options.spool_dir, why) || !spool.Write(body.data(), body.size())) return failed = true, false;
        body.clear();
      }
      if (spool.size() + n > options.max_spooled_body) return too_large = true, false;
      if (!spool.Write(data, n)) return failed = true, false;
      return true;
    });
    if (too_large || failed) {
      http::Answer ans;
      problems(too_large ? http::Refusal{.status = 413,
                                         .type = "body-too-large",
                                         .title = "Body too large",
                                         .detail = "the body is over " + std::to_string(options.max_spooled_body) +
                                                   " bytes (max_spooled_body)",
                                         .retry = "no"}
                         : http::Refusal{.status = 503,
                                         .type = "spool-unavailable",
                                         .title = "Body could not be spooled",
                                         .detail = why.empty() ? "the spool file could not be written" : why,
                                         .retry = "same-key"},
               ans);
      if (!too_large) ans.headers.Set("Retry-After", "1");
      WriteAnswer(ans, res);
      return;
    }
    if (!read) return;  // the client left: nobody to answer
    if (!spooled) {
      Serve(req, res, BodySource{.bytes = &body}, &body);
      return;
    }
    // The fingerprint covers the spooled bytes as they are (their SHA-256;
    // no JSON or form canonicalisation at this size).
    std::string stand_in = "idem-spooled-body sha256:" + spool.Sha256() + " bytes:" + std::to_string(spool.size());
    Serve(req, res, BodySource{.spool = &spool}, &stand_in);
  }

  // `req` answered into `res`, its body forwarded from `body`; `fingerprinted`
  // (when not null) is what the key's fingerprint takes as the body instead of
  // req.body.
  void Serve(const ::httplib::Request& req, ::httplib::Response& res, const BodySource& body,
             const std::string* fingerprinted) {
    const auto start = std::chrono::steady_clock::now();
    Outcome outcome = kPassed;
    http::Answer ans;
    if (!options.metrics_path.empty() && req.method == "GET" && req.path == options.metrics_path) {
      res.set_content(Metrics(), "text/plain; version=0.0.4; charset=utf-8");
      return;
    }
    const bool guarded = Guarded(req);
    if (!guarded) {
      bool sent = false;
      std::string why;
      passed.fetch_add(1, std::memory_order_relaxed);
      if (!Forward(req, body, ans, sent, why)) {
        outcome = kUpstreamError;
        UpstreamDown(ans, why);
      }
    } else {
      http::Request core = ToRequest(req);
      if (!req.target.empty()) core.path = req.target;
      if (fingerprinted != nullptr) core.body = *fingerprinted;
      bool ran = false, lost = false, unreached = false;
      idempotency->Serve(*route, core, ans, [&](const http::Request&, http::Answer& out, Transaction*) {
        ran = true;
        bool sent = false;
        std::string why;
        in_flight.fetch_add(1, std::memory_order_relaxed);
        const bool answered = Forward(req, body, out, sent, why);
        in_flight.fetch_sub(1, std::memory_order_relaxed);
        if (answered || sent) forwarded.fetch_add(1, std::memory_order_relaxed);
        if (answered) return;
        if (sent) {
          lost = true;
          http::OutcomeUnknown("the upstream gave no answer (" + why + ")");
          return;
        }
        unreached = true;
        http::NotExecuted();  // the key is freed
        UpstreamDown(out, why);
      });
      if (lost) {
        outcome = kUnknown;
      } else if (unreached) {
        outcome = kUpstreamError;
      } else if (ran) {
        outcome = kForwarded;
      } else if (ans.status == 503 && ans.body.find("/outcome-unknown\"") != std::string::npos) {
        outcome = kUnknown;  // found its holder gone, or a repeat of such a key
      } else if (ans.headers.Get("Idempotent-Replayed") == "true") {
        outcome = kReplayed;
      } else if (ans.status == 422) {
        outcome = kConflict;
      } else if (ans.status == 409) {
        outcome = kInProgress;
      } else {
        outcome = kRefused;
      }
    }
    WriteAnswer(ans, res);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    latency.Add(outcome, seconds);
    if (!options.request_log || !guarded) return;
    std::string key = req.get_header_value("Idempotency-Key");
    if (Result<std::string> parsed = http::ParseKey(key); parsed.ok()) key = std::move(*parsed);
    options.request_log({.method = req.method,
                         .path = req.target.empty() ? req.path : req.target,
                         .key = key,
                         .outcome = kOutcomeNames[outcome],
                         .status = ans.status,
                         .latency_seconds = seconds});
  }

  Counters Count() const {
    const http::Idempotency::Counters c = idempotency->counters();
    Counters out;
    out.forwarded = forwarded.load();
    out.replayed = c.replayed;
    out.in_flight = in_flight.load();
    out.conflicts = c.conflicts;
    out.in_progress = c.in_progress;
    out.outcome_unknown = c.outcome_unknown;
    out.not_stored = c.not_stored;
    out.passed = passed.load();
    out.upstream_errors = upstream_errors.load();
    out.waiting = c.waiting;
    out.purged = purged.load();
    out.purge_errors = purge_errors.load();
    return out;
  }

  std::string Metrics() const {
    using hi::AppendMetric;
    const Counters c = Count();
    std::string out;
    AppendMetric(out, "idem_gateway_forwarded_total", "Guarded requests forwarded to the upstream.", "counter",
                 c.forwarded);
    AppendMetric(out, "idem_gateway_replayed_total", "Repeats answered with the stored response.", "counter",
                 c.replayed);
    AppendMetric(out, "idem_gateway_in_flight", "Guarded requests at the upstream now.", "gauge", c.in_flight);
    AppendMetric(out, "idem_gateway_conflicts_total", "Keys reused with another request (422).", "counter",
                 c.conflicts);
    AppendMetric(out, "idem_gateway_in_progress_total", "Repeats while the first request ran (409).", "counter",
                 c.in_progress);
    AppendMetric(out, "idem_gateway_outcome_unknown_total", "Keys whose outcome is unknown (forwarded, answer lost).",
                 "counter", c.outcome_unknown);
    AppendMetric(out, "idem_gateway_not_stored_total", "Responses over the stored body bound (not stored).", "counter",
                 c.not_stored);
    AppendMetric(out, "idem_gateway_passed_total", "Requests forwarded unguarded.", "counter", c.passed);
    AppendMetric(out, "idem_gateway_upstream_errors_total", "Requests that could not reach the upstream.", "counter",
                 c.upstream_errors);
    const Server::Counters s = server->counters();
    AppendMetric(out, "idem_http_connections_refused_total", "Connections refused over a bound.", "counter",
                 static_cast<uint64_t>(s.refused));
    AppendMetric(out, "idem_http_proxy_refused_total",
                 "Connections closed for a PROXY header (untrusted address, malformed or missing).", "counter",
                 static_cast<uint64_t>(s.proxy_refused));
    AppendMetric(out, "idem_http_forwarded_for_malformed_total",
                 "Requests from a trusted proxy whose X-Forwarded-For named no client.", "counter",
                 static_cast<uint64_t>(s.forwarded_for_malformed));
    latency.Write(out, "idem_gateway_request_seconds", "Time from a request's arrival to its answer, by outcome.");
    AppendMetric(out, "idem_gateway_waiting", "Repeats waiting now for their key's first request.", "gauge", c.waiting);
    AppendMetric(out, "idem_gateway_purged_total", "Expired keys deleted from the store.", "counter", c.purged);
    AppendMetric(out, "idem_gateway_purge_errors_total", "Purges of expired keys that failed.", "counter",
                 c.purge_errors);
    return out;
  }
};

Result<std::unique_ptr<Gateway>> Gateway::Open(const Options& options) {
  if (options.claims == nullptr) return Status::InvalidArgument("Gateway::Options::claims is null");
  IDEM_ASSIGN_OR_RETURN(hi::BaseUrl url, hi::ParseBaseUrl(options.upstream, "Gateway::Options::upstream"));
  if (options.methods.empty()) return Status::InvalidArgument("Gateway::Options::methods is empty");
  for (const std::string& p : options.paths)
    if (p.empty() || p[0] != '/')
      return Status::InvalidArgument("Gateway::Options::paths: a path prefix starts with '/', got '" + p + "'");
  if (options.principal_header.empty()) return Status::InvalidArgument("Gateway::Options::principal_header is empty");
  if (options.max_stored_body == 0) return Status::InvalidArgument("Gateway::Options::max_stored_body must be > 0");
  if (options.max_body_bytes == 0) return Status::InvalidArgument("Gateway::Options::max_body_bytes must be > 0");
  if (options.connect_timeout_ms <= 0 || options.upstream_timeout_ms <= 0)
    return Status::InvalidArgument("Gateway::Options: connect_timeout_ms and upstream_timeout_ms must be > 0");
  if (options.lease_ms <= options.connect_timeout_ms + 2 * options.upstream_timeout_ms)
    return Status::InvalidArgument(
        "Gateway::Options::lease_ms must be more than connect_timeout_ms + 2 * upstream_timeout_ms (" +
        std::to_string(options.connect_timeout_ms + 2 * options.upstream_timeout_ms) + " ms), got " +
        std::to_string(options.lease_ms) + ": a live gateway must answer before its lease runs out");
  if (options.port < 0 || options.port > 65535)
    return Status::InvalidArgument("Gateway::Options::port must be 0..65535, got " + std::to_string(options.port));
  if (options.threads < 1) return Status::InvalidArgument("Gateway::Options::threads must be >= 1");
  namespace oi = options_internal;
  IDEM_RETURN_IF_ERROR(oi::AtLeast("idem::httplib::Gateway", "wait_ms", options.wait_ms, 0));
  IDEM_RETURN_IF_ERROR(oi::AtLeast("idem::httplib::Gateway", "wait_poll_ms", options.wait_poll_ms, 1));
  IDEM_RETURN_IF_ERROR(oi::AtLeast("idem::httplib::Gateway", "purge_every_ms", options.purge_every_ms, 0));
  IDEM_RETURN_IF_ERROR(
      oi::AtLeast("idem::httplib::Gateway", "max_keys_per_principal", options.max_keys_per_principal, 0));

  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->url = url;
  const hi::PoolOptions pool{.ca_file = options.ca_file,
                             .ca_dir = options.ca_dir,
                             .connect_timeout_ms = options.connect_timeout_ms,
                             .read_timeout_ms = options.upstream_timeout_ms,
                             .pool_size = options.threads,
                             .bearer = "",
                             .max_idle_ms = kUpstreamIdleMs};
  impl->pool = std::make_unique<hi::ConnectionPool>(url, pool);
  const std::string header = options.principal_header;
  IDEM_ASSIGN_OR_RETURN(
      impl->idempotency,
      http::Idempotency::Open({.claims = options.claims,
                               .authenticate = [header](const http::Request& r) -> std::optional<std::string> {
                                 const std::string* v = r.headers.Find(header);
                                 if (v == nullptr) return std::nullopt;
                                 return "sha256:" + ToHex(FingerprintOf(*v));  // never in the clear
                               },
                               .max_body_bytes = options.max_body_bytes,
                               .max_keys_per_principal = options.max_keys_per_principal,
                               // With request_log, its lines instead.
                               .log = options.request_log ? nullptr : options.log,
                               .observer = options.observer}));
  http::RoutePolicy policy;
  policy.methods = options.methods;
  policy.require_key = options.require_key;
  policy.lease_ms = options.lease_ms;
  policy.takeover = options.upstream_honours_key ? http::RoutePolicy::Takeover::kRunAgain
                                                 : http::RoutePolicy::Takeover::kOutcomeUnknown;
  policy.store_5xx = !options.upstream_honours_key && !options.forward_again_after_5xx;
  policy.stored_headers = options.stored_headers;
  policy.max_stored_body = options.max_stored_body;
  policy.fingerprint_target = true;
  policy.wait_ms = options.wait_ms;
  policy.wait_poll_ms = options.wait_poll_ms;
  IDEM_ASSIGN_OR_RETURN(impl->route,
                        impl->idempotency->AddRoute("gateway", http::RouteKind::kTwoPhase, std::move(policy)));

  IDEM_ASSIGN_OR_RETURN(impl->server, Server::Open({.max_connections = options.max_connections,
                                                    .max_connections_per_client = options.max_connections_per_client,
                                                    .threads = options.threads,
                                                    .keep_alive_requests = options.keep_alive_requests,
                                                    .trusted_proxies = options.trusted_proxies,
                                                    .proxy_protocol = options.proxy_protocol,
                                                    .log = options.log}));
  ::httplib::Server& native = impl->server->native();
  // SO_REUSEADDR alone (cpp-httplib's SO_REUSEPORT would share a busy port),
  // and the socket noted: cpp-httplib 0.11 listens with a backlog of 5, and a
  // burst of clients (a retry storm) would find connections reset.
  auto listen_fd = std::make_shared<socket_t>(INVALID_SOCKET);
  native.set_socket_options([listen_fd](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    *listen_fd = sock;
  });
  native.set_payload_max_length(std::max(options.max_body_bytes, options.max_spooled_body));
  Impl* raw = impl.get();
  const auto handler = [raw](const ::httplib::Request& req, ::httplib::Response& res) { raw->Handle(req, res); };
  const std::string any = ".*";
  native.Get(any, handler);
  native.Options(any, handler);
  if (options.max_spooled_body > options.max_body_bytes) {
    // Bodies read by the gateway itself (spooled, or streamed through).
    const auto reading = [raw](const ::httplib::Request& req, ::httplib::Response& res,
                               const ::httplib::ContentReader& reader) { raw->HandleReading(req, res, reader); };
    native.Post(any, reading);
    native.Put(any, reading);
    native.Patch(any, reading);
    native.Delete(any, reading);
  } else {
    native.Post(any, handler);
    native.Put(any, handler);
    native.Patch(any, handler);
    native.Delete(any, handler);
  }
  if (options.port == 0) {
    impl->port = native.bind_to_any_port(options.host);
    if (impl->port <= 0) return Status::Unavailable("gateway: cannot listen on " + options.host + ": no free port");
  } else {
    if (!native.bind_to_port(options.host, options.port))
      return Status::Unavailable("gateway: cannot listen on " + options.host + ":" + std::to_string(options.port) +
                                 " (in use, or not an address of this machine?)");
    impl->port = options.port;
  }
  if (*listen_fd != INVALID_SOCKET && ::listen(*listen_fd, SOMAXCONN) != 0)
    return Status::Unavailable("gateway: cannot listen on " + options.host + ":" + std::to_string(impl->port));
  if (options.purge_every_ms > 0)
    impl->purger = std::thread([raw, every = options.purge_every_ms] { raw->PurgeEvery(every); });
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gateway::~Gateway() { Stop(); }

Status Gateway::Run() {
  if (!impl_->server->native().listen_after_bind())
    return Status::Unavailable("gateway: serving on port " + std::to_string(impl_->port) + " ended with an error");
  return Status::OK();
}

void Gateway::Stop() noexcept { impl_->server->Stop(); }
int Gateway::port() const { return impl_->port; }
Server& Gateway::server() { return *impl_->server; }
void Gateway::Handle(const ::httplib::Request& req, ::httplib::Response& res) { impl_->Handle(req, res); }
Gateway::Counters Gateway::counters() const { return impl_->Count(); }
std::string Gateway::Metrics() const { return impl_->Metrics(); }
Result<int64_t> Gateway::PurgeExpired() { return impl_->Purge(); }

}  // namespace idem::httplib
