// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/http/client.h"

#include <httplib.h>
#include <openssl/x509.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>

#include "core/backoff.h"
#include "core/options_check.h"
#include "http/pool.h"
#include "idem/consumer.h"
#include "idem/http/request.h"
#include "idem/trace.h"
#include "idem/url.h"

namespace idem::http {

namespace {

using http_internal::CheckHeaderValue;
using http_internal::CheckPath;
using http_internal::FirstByteOutside;
using http_internal::HexByte;

// Backoffs are slept in slices of at most this, so that Cancel() and a
// stopping Consumer are seen within one slice.
constexpr int64_t kSleepSliceMs = 50;

std::string Attempts(int n) { return std::to_string(n) + (n == 1 ? " attempt" : " attempts"); }

bool IsTokenChar(unsigned char c) {
  return std::isalnum(c) || (c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);
}

// A header the caller may send (see HeaderList).
Status CheckHeader(std::string_view name, std::string_view value, bool bearer_set) {
  const std::string quoted = "header '" + std::string(name.substr(0, 64)) + "'";
  if (name.empty()) return Status::InvalidArgument("a header has an empty name");
  for (unsigned char c : name)
    if (!IsTokenChar(c))
      return Status::InvalidArgument(quoted + ": its name holds byte " + HexByte(c) +
                                     ", which a header name cannot carry (letters, digits and !#$%&'*+-.^_`|~ only)");
  IDEM_RETURN_IF_ERROR(CheckHeaderValue(name, value));
  for (std::string_view own :
       {"Idempotency-Key", "Content-Type", "Content-Length", "Transfer-Encoding", "Host", "Connection"})
    if (EqualsIgnoringCase(name, own)) return Status::InvalidArgument(quoted + " is set by the Client itself");
  if (bearer_set && EqualsIgnoringCase(name, "Authorization"))
    return Status::InvalidArgument(quoted + " would clash with Client::Options::bearer");
  return Status::OK();
}

Status CheckHeaders(const HeaderList& headers, bool bearer_set) {
  for (const auto& [name, value] : headers) IDEM_RETURN_IF_ERROR(CheckHeader(name, value, bearer_set));
  return Status::OK();
}

// Why `key` cannot be an Idempotency-Key, or OK.
Status CheckKey(std::string_view key) {
  constexpr char kUse[] = "make keys with idem::DownstreamKey(message, step), which gives 1 to 255 bytes of 0x20-0x7E";
  if (key.empty()) return Status::InvalidArgument(std::string("an Idempotency-Key is required: ") + kUse);
  if (key.size() > 255)
    return Status::InvalidArgument("the Idempotency-Key is " + std::to_string(key.size()) +
                                   " bytes; the header takes at most 255: " + kUse);
  if (int i = FirstByteOutside(key, 0x20, 0x7e); i >= 0)
    return Status::InvalidArgument("the Idempotency-Key holds byte " + HexByte(static_cast<unsigned char>(key[i])) +
                                   " at offset " + std::to_string(i) +
                                   ", which an RFC 8941 sf-string cannot carry (0x20-0x7E only): " + kUse);
  return Status::OK();
}

}  // namespace

std::string QuoteKey(std::string_view key) {
  std::string out = "\"";
  for (char c : key) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string Response::header(const std::string& name) const {
  for (const auto& [k, v] : headers)
    if (EqualsIgnoringCase(k, name)) return v;
  return std::string();
}

struct Client::Impl {
  using Connection = http_internal::ConnectionPool::Connection;
  using Send = std::function<httplib::Result(httplib::ClientImpl&)>;

  Client::Options options;
  http_internal::ConnectionPool pool;
  const http_internal::BaseUrl& url;  // pool's
  httplib::Headers headers;           // options.headers, as httplib takes them
  std::atomic<bool> cancelled{false};

  Impl(Client::Options o, http_internal::BaseUrl u)
      : options(std::move(o)),
        pool(std::move(u), {.ca_file = options.ca_file,
                            .ca_dir = options.ca_dir,
                            .connect_timeout_ms = options.connect_timeout_ms,
                            .read_timeout_ms = options.read_timeout_ms,
                            .pool_size = options.pool_size,
                            .bearer = options.bearer}),
        url(pool.url()) {
    for (const auto& [k, v] : options.headers) headers.emplace(k, v);
  }

  // Why requests must stop now, or "" to go on.
  std::string StopReason() const {
    if (cancelled.load(std::memory_order_acquire)) return "cancelled (Client::Cancel)";
    if (StopRequested()) return "cancelled (the Consumer is stopping)";
    return std::string();
  }

  // Sleeps `ms` in slices; false as soon as StopReason() is not empty.
  bool Sleep(int64_t ms) {
    while (ms > 0) {
      if (!StopReason().empty()) return false;
      const int64_t slice = std::min(ms, kSleepSliceMs);
      options.env->SleepMs(slice);
      ms -= slice;
    }
    return StopReason().empty();
  }

  int64_t Backoff(int attempt, int64_t retry_after_ms) {
    const int64_t d =
        internal::JitteredBackoffMs(options.backoff_base_ms, options.backoff_max_ms, attempt, *options.env);
    return std::min(std::max(d, retry_after_ms), std::max(options.backoff_max_ms, d));
  }

  // Sends with retries; `send` makes one attempt on a connection. `keyed`:
  // a POST with an Idempotency-Key (failures say whether it may have been
  // applied); otherwise a GET (409 is an answer, failures are kUnavailable).
  Result<Response> Run(const std::string& what, bool keyed, const Send& send) {
    std::string last = "no attempt made";
    int sent = 0;                // attempts made
    bool maybe_applied = false;  // an attempt reached the server without a final answer
    bool rate_limited = false;   // an answer was 429
    int last_status = 0;         // of the last attempt; 0: no answer
    bool permanent = false;
    const auto stopped = [&](const std::string& why) {
      std::string m = what + ": " + why + " after " + Attempts(sent);
      if (maybe_applied)
        m += "; an attempt may have reached the server and been applied: retry later with the same key to "
             "learn the outcome";
      return Status::Aborted(m + "; last: " + last);
    };
    for (int attempt = 1; attempt <= options.max_attempts; ++attempt) {
      if (std::string why = StopReason(); !why.empty()) return stopped(why);
      Connection c = pool.Take();
      httplib::Result r = send(*c);
      ++sent;
      int64_t retry_after_ms = 0;
      if (!r) {
        last_status = 0;
        last = pool.Describe(r.error(), *c);
        if (!http_internal::FailedToConnect(r.error())) maybe_applied = true;
        if (http_internal::Permanent(r.error())) {
          permanent = true;
          break;
        }
        // `c` is closed: httplib leaves a failed connection in no known state.
      } else {
        pool.GiveBack(std::move(c));
        const int st = r->status;
        last_status = st;
        if (st == 422)
          return Status::Conflict(what +
                                  ": 422: the Idempotency-Key was already used with another body; this is a "
                                  "bug in the caller (a key must stand for one request): " +
                                  r->body);
        const bool retry = st >= 500 || st == 429 || (keyed && st == 409);
        if (!retry) {
          Response out;
          out.status = st;
          for (const auto& [k, v] : r->headers) out.headers.emplace(k, v);
          out.body = r->body;
          out.attempts = sent;
          out.replayed = r->get_header_value("Idempotent-Replayed") == "true";
          return out;
        }
        if (st >= 500) maybe_applied = true;
        if (st == 429) rate_limited = true;
        last = "HTTP " + std::to_string(st) + ": " + r->body.substr(0, 300);
        const std::string ra = r->get_header_value("Retry-After");
        int64_t secs = 0;
        if (!ra.empty() && std::from_chars(ra.data(), ra.data() + ra.size(), secs).ec == std::errc())
          retry_after_ms = secs * 1000;
      }
      if (attempt < options.max_attempts && !Sleep(Backoff(attempt, retry_after_ms))) return stopped(StopReason());
    }
    const std::string tried = permanent ? "not retried after " + Attempts(sent) : "gave up after " + Attempts(sent);
    if (!keyed) return Status::Unavailable(what + ": " + tried + "; last: " + last);
    if (last_status == 409)
      return Status::InProgress(
          what + ": " + tried +
          ": the server is still processing this key (409); retry later with the same key; last: " + last);
    if (maybe_applied)
      return Status::InDoubt(what + ": " + tried +
                             " and the request may have been applied (an attempt got no answer or a 5xx): retry later "
                             "with the same key to learn the outcome, never with a new one; last: " +
                             last);
    if (rate_limited) return Status::Busy(what + ": " + tried + ": rate limited (429), not applied; last: " + last);
    return Status::Unavailable(what + ": " + tried + ": the server was not reached, nothing was sent; last: " + last);
  }

  // The request target: the base path, then `path` (one slash between).
  Result<std::string> Target(std::string_view path) const {
    IDEM_RETURN_IF_ERROR(CheckPath("the path", path));
    std::string target = url.path;
    if (path.empty() || path.front() != '/') target += '/';
    return target + std::string(path);
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Open(const Options& options) {
  Result<http_internal::BaseUrl> url = http_internal::ParseBaseUrl(options.base_url);
  if (!url.ok()) return url.status();
  using options_internal::AtLeast;
  constexpr std::string_view kWhat = "http client";
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "max_attempts", options.max_attempts, 1));
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "backoff_base_ms", options.backoff_base_ms, 0));
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "backoff_max_ms", options.backoff_max_ms, 0));
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "connect_timeout_ms", options.connect_timeout_ms, 0));
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "read_timeout_ms", options.read_timeout_ms, 0));
  // 0: no idle connection kept (each call connects anew).
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "pool_size", options.pool_size, 0));
  IDEM_RETURN_IF_ERROR(CheckHeaderValue("Authorization", options.bearer));
  IDEM_RETURN_IF_ERROR(CheckHeaders(options.headers, !options.bearer.empty()));
  if (!options.ca_file.empty() && !std::ifstream(options.ca_file).good())
    return Status::InvalidArgument("cannot read ca_file '" + options.ca_file + "'");
  Options kept = options;
  if (kept.env == nullptr) kept.env = Env::Default();
  return std::unique_ptr<Client>(new Client(std::make_unique<Impl>(std::move(kept), std::move(*url))));
}

namespace {
// The calling thread's trace (idem/trace.h) on a request that names none of
// its own (httplib's Headers compare names without case).
void AddTrace(httplib::Headers& headers) {
  const TraceContext* trace = CurrentTrace();
  if (trace == nullptr || headers.count("traceparent") > 0) return;
  headers.emplace("traceparent", trace->traceparent);
  if (!trace->tracestate.empty() && headers.count("tracestate") == 0) headers.emplace("tracestate", trace->tracestate);
}
}  // namespace

Result<Response> Client::Post(std::string_view path, std::string_view body, std::string_view key,
                              std::string_view content_type) {
  return Post(path, body, key, HeaderList{}, content_type);
}

Result<Response> Client::Post(std::string_view path, std::string_view body, std::string_view key,
                              const HeaderList& extra, std::string_view content_type) {
  IDEM_RETURN_IF_ERROR(CheckKey(key));
  IDEM_RETURN_IF_ERROR(CheckHeaders(extra, !impl_->options.bearer.empty()));
  IDEM_RETURN_IF_ERROR(CheckHeaderValue("Content-Type", content_type));
  Result<std::string> target = impl_->Target(path);
  if (!target.ok()) return target.status();
  httplib::Headers headers = impl_->headers;
  for (const auto& [k, v] : extra) headers.emplace(k, v);
  headers.emplace("Idempotency-Key", QuoteKey(key));
  AddTrace(headers);
  const std::string b(body), ct(content_type);
  return impl_->Run("POST " + *target + " with Idempotency-Key " + QuoteKey(key), /*keyed=*/true,
                    [&](httplib::ClientImpl& c) { return c.Post(*target, headers, b, ct); });
}

Result<Response> Client::Get(std::string_view path) {
  Result<std::string> target = impl_->Target(path);
  if (!target.ok()) return target.status();
  httplib::Headers headers = impl_->headers;
  AddTrace(headers);
  return impl_->Run("GET " + *target, /*keyed=*/false, [&](httplib::ClientImpl& c) { return c.Get(*target, headers); });
}

void Client::Cancel() noexcept { impl_->cancelled.store(true, std::memory_order_release); }

}  // namespace idem::http
