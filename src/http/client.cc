// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/http/client.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace idem::http {

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
    if (k.size() == name.size() && std::equal(k.begin(), k.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
        }))
      return v;
  return std::string();
}

struct Client::Impl {
  ClientOptions options;
  httplib::Client http;
  Impl(ClientOptions o, const std::string& host, int port) : options(std::move(o)), http(host, port) {}

  int64_t Backoff(int attempt, int64_t retry_after_ms) {
    int64_t d = options.backoff_base_ms;
    for (int i = 1; i < attempt && d < options.backoff_max_ms; ++i) d *= 2;
    d = std::min(d, options.backoff_max_ms);
    d += static_cast<int64_t>(options.env->Random() % static_cast<uint64_t>(d / 4 + 1));
    return std::min(std::max(d, retry_after_ms), std::max(options.backoff_max_ms, d));
  }

  // Sends with retries; `send` makes one attempt.
  Result<Response> Run(std::string_view what, bool retry_409, const std::function<httplib::Result()>& send) {
    std::string last = "no attempt made";
    for (int attempt = 1; attempt <= options.max_attempts; ++attempt) {
      httplib::Result r = send();
      int64_t retry_after_ms = 0;
      if (!r) {
        last = "connection error: " + httplib::to_string(r.error());
      } else {
        const int st = r->status;
        const bool retry = st >= 500 || st == 429 || (retry_409 && st == 409);
        if (st == 422)
          return Status(Code::kConflict, std::string(what) +
                                             ": 422: the Idempotency-Key was already used with another body; this is a "
                                             "bug in the caller (a key must stand for one request): " + r->body);
        if (!retry) {
          Response out;
          out.status = st;
          for (const auto& [k, v] : r->headers) out.headers.emplace(k, v);
          out.body = r->body;
          out.attempts = attempt;
          out.replayed = r->get_header_value("Idempotent-Replayed") == "true";
          return out;
        }
        last = "HTTP " + std::to_string(st) + ": " + r->body.substr(0, 300);
        const std::string ra = r->get_header_value("Retry-After");
        int64_t secs = 0;
        if (!ra.empty() && std::from_chars(ra.data(), ra.data() + ra.size(), secs).ec == std::errc())
          retry_after_ms = secs * 1000;
      }
      if (attempt < options.max_attempts) options.env->SleepMs(Backoff(attempt, retry_after_ms));
    }
    return Status::Unavailable(std::string(what) + ": gave up after " + std::to_string(options.max_attempts) +
                               " attempts; last: " + last);
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  constexpr std::string_view kScheme = "http://";
  std::string_view url = options.base_url;
  if (url.substr(0, kScheme.size()) != kScheme)
    return Status::InvalidArgument("base URL must start with http:// (got '" + options.base_url + "')");
  url.remove_prefix(kScheme.size());
  while (!url.empty() && url.back() == '/') url.remove_suffix(1);
  if (url.find('/') != std::string_view::npos)
    return Status::InvalidArgument("base URL must be http://host[:port] without a path (got '" + options.base_url + "')");
  std::string host(url);
  int port = 80;
  if (auto colon = url.rfind(':'); colon != std::string_view::npos) {
    host = std::string(url.substr(0, colon));
    std::string_view p = url.substr(colon + 1);
    const auto parsed = std::from_chars(p.data(), p.data() + p.size(), port);
    if (p.empty() || parsed.ec != std::errc() || parsed.ptr != p.data() + p.size() || port < 1 || port > 65535)
      return Status::InvalidArgument("bad port in base URL '" + options.base_url + "'");
  }
  if (host.empty()) return Status::InvalidArgument("no host in base URL '" + options.base_url + "'");
  if (options.max_attempts < 1) return Status::InvalidArgument("max_attempts must be at least 1");
  if (options.backoff_base_ms < 0 || options.backoff_max_ms < 0)
    return Status::InvalidArgument("backoff_base_ms and backoff_max_ms must be >= 0, got " +
                                   std::to_string(options.backoff_base_ms) + " and " +
                                   std::to_string(options.backoff_max_ms));
  if (options.env == nullptr) options.env = Env::Default();
  auto impl = std::make_unique<Impl>(std::move(options), host, port);
  const ClientOptions& o = impl->options;
  impl->http.set_connection_timeout(std::chrono::milliseconds(o.connect_timeout_ms));
  impl->http.set_read_timeout(std::chrono::milliseconds(o.read_timeout_ms));
  impl->http.set_write_timeout(std::chrono::milliseconds(o.read_timeout_ms));
  impl->http.set_keep_alive(true);
  impl->http.set_tcp_nodelay(true);
  if (!o.bearer.empty()) impl->http.set_bearer_token_auth(o.bearer);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Result<Response> Client::Post(std::string_view path, std::string_view body, std::string_view key,
                              std::string_view content_type) {
  if (key.empty()) return Status::InvalidArgument("an idempotency key is required");
  // An sf-string holds printable ASCII only: anything else (a CR or LF would
  // even start a header of its own) is refused, not sent.
  if (key.size() > 255)
    return Status::InvalidArgument("the idempotency key is " + std::to_string(key.size()) +
                                   " bytes; the header takes at most 255");
  for (unsigned char c : key)
    if (c < 0x20 || c > 0x7e)
      return Status::InvalidArgument("the idempotency key holds a byte the header cannot carry (0x" +
                                     std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15] +
                                     "): use printable ASCII, e.g. a hash of the message id");
  httplib::Headers headers{{"Idempotency-Key", QuoteKey(key)}};
  const std::string p(path), b(body), ct(content_type);
  return impl_->Run("POST " + p, /*retry_409=*/true,
                    [&] { return impl_->http.Post(p, headers, b, ct); });
}

Result<Response> Client::Get(std::string_view path) {
  const std::string p(path);
  return impl_->Run("GET " + p, /*retry_409=*/false, [&] { return impl_->http.Get(p); });
}

}  // namespace idem::http
