// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "pubsub/rest.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <utility>

#include "core/env_var.h"
#include "core/options_check.h"
#include "http/pool.h"
#include "http/retry.h"

namespace idem::pubsub_internal {

namespace {

using http_internal::BaseUrl;
using http_internal::ConnectionPool;

std::string GetEnv(const char* name) { return internal::EnvVar(name); }

// The first line of `path`, trimmed; kInvalidArgument when unreadable or empty.
Result<std::string> ReadToken(const std::string& path, std::string_view where) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line))
    return Status::InvalidArgument("cannot read the Pub/Sub access token file '" + path + "' (" + std::string(where) +
                                   ")");
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
  if (line.empty())
    return Status::InvalidArgument("the Pub/Sub access token file '" + path + "' (" + std::string(where) +
                                   ") is empty");
  return line;
}

}  // namespace

Result<Endpoint> FindEndpoint(std::string_view endpoint, std::string_view token, std::string_view token_file) {
  Endpoint out;
  if (!token.empty()) {
    out.bearer = std::string(token);
  } else if (!token_file.empty()) {
    IDEM_ASSIGN_OR_RETURN(out.bearer, ReadToken(std::string(token_file), "token_file"));
  }
  if (!endpoint.empty()) {
    out.url = std::string(endpoint);
    out.where = "endpoint=";
    return out;
  }
  if (std::string host = GetEnv("PUBSUB_EMULATOR_HOST"); !host.empty()) {
    out.url = "http://" + host;
    out.where = "PUBSUB_EMULATOR_HOST";
    return out;
  }
  out.url = std::string(kServiceEndpoint);
  out.where = "the service's endpoint";
  if (out.bearer.empty()) out.bearer = GetEnv("GOOGLE_OAUTH_ACCESS_TOKEN");
  if (out.bearer.empty()) {
    if (std::string f = GetEnv("GOOGLE_OAUTH_ACCESS_TOKEN_FILE"); !f.empty()) {
      IDEM_ASSIGN_OR_RETURN(out.bearer, ReadToken(f, "GOOGLE_OAUTH_ACCESS_TOKEN_FILE"));
    }
  }
  if (out.bearer.empty())
    return Status::InvalidArgument(
        "Pub/Sub at " + out.url +
        " needs an OAuth 2.0 access token: give token_file= (or Options::access_token), or set "
        "GOOGLE_OAUTH_ACCESS_TOKEN or GOOGLE_OAUTH_ACCESS_TOKEN_FILE (e.g. from `gcloud auth print-access-token`); "
        "idem does not exchange service-account keys for tokens. For the emulator give endpoint= or set "
        "PUBSUB_EMULATOR_HOST");
  return out;
}

bool Retryable(const RestError& e) {
  if (e.http_status == 429 || e.http_status >= 500) return true;
  for (std::string_view s : {"UNAVAILABLE", "RESOURCE_EXHAUSTED", "INTERNAL", "ABORTED", "DEADLINE_EXCEEDED"})
    if (e.status == s) return true;
  return false;
}

Status ToStatus(const RestError& e, std::string_view what_view) {
  const std::string what(what_view);
  const std::string said = "HTTP " + std::to_string(e.http_status) + (e.status.empty() ? "" : " " + e.status) +
                           (e.message.empty() ? std::string() : ": " + e.message);
  if (e.status == "NOT_FOUND" || (e.status.empty() && e.http_status == 404))
    return Status::NotFound(what + ": not found (" + said + ")");
  if (e.http_status == 429 || e.status == "RESOURCE_EXHAUSTED")
    return Status::Busy(what + ": throttled by the service (" + said + "); retry later");
  if (e.status == "UNAUTHENTICATED" || e.status == "PERMISSION_DENIED" || e.http_status == 401 || e.http_status == 403)
    return Status::InvalidArgument(what + ": the access token was refused (" + said +
                                   "): check that it is current and may use this project");
  if (Retryable(e)) return Status::Unavailable(what + ": the service failed (" + said + ")");
  return Status::InvalidArgument(what + ": " + said);
}

struct RestClient::Impl {
  RestOptions options;
  ConnectionPool pool;

  Impl(RestOptions o, BaseUrl url)
      : options(std::move(o)),
        pool(std::move(url), {.ca_file = options.ca_file,
                              .connect_timeout_ms = options.connect_timeout_ms,
                              .read_timeout_ms = options.read_timeout_ms,
                              .pool_size = options.pool_size,
                              .bearer = options.endpoint.bearer}) {}

  http_internal::Attempt<RestReply> Once(std::string_view method, const std::string& path, const std::string* payload) {
    http_internal::Attempt<RestReply> out;
    const std::string full = pool.url().path + path;
    const httplib::Headers headers;
    constexpr const char* kJson = "application/json";
    ConnectionPool::Exchange ex = pool.Send([&](httplib::ClientImpl& c) {
      return method == "GET"      ? c.Get(full, headers)
             : method == "PUT"    ? c.Put(full, headers, *payload, kJson)
             : method == "DELETE" ? c.Delete(full, headers)
                                  : c.Post(full, headers, payload ? *payload : std::string(), kJson);
    });
    if (!ex.response) {
      out.failure = ex.failure;
      out.sent = ex.sent;
      out.permanent = ex.permanent;
      return out;
    }
    const httplib::Response* r = &*ex.response;
    RestReply reply;
    nlohmann::json body = r->body.empty() ? nlohmann::json::object()
                                          : nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (r->status >= 200 && r->status < 300 && !body.is_discarded() && body.is_object()) {
      reply.body = std::move(body);
    } else {
      RestError e;
      e.http_status = r->status;
      if (!body.is_discarded() && body.is_object() && body.contains("error") && body["error"].is_object()) {
        const nlohmann::json& err = body["error"];
        e.status = err.value("status", std::string());
        e.message = err.value("message", std::string());
      } else {
        e.status = r->status >= 200 && r->status < 300 ? "MALFORMED_RESPONSE" : std::string();
        e.message = r->body.substr(0, 300);
      }
      out.retry = Retryable(e);
      out.sent = e.http_status >= 500;
      out.failure = "HTTP " + std::to_string(e.http_status) + " " + e.status + ": " + e.message;
      reply.error = std::move(e);
    }
    out.reply = std::move(reply);
    return out;
  }
};

RestClient::RestClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RestClient::~RestClient() = default;

Result<std::unique_ptr<RestClient>> RestClient::Open(const RestOptions& options) {
  using options_internal::AtLeast;
  constexpr std::string_view what = "Pub/Sub client";
  IDEM_RETURN_IF_ERROR(AtLeast(what, "max_attempts", options.max_attempts, 1));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "backoff_base_ms", options.backoff_base_ms, 0));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "backoff_max_ms", options.backoff_max_ms, 0));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "connect_timeout_ms", options.connect_timeout_ms, 1));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "read_timeout_ms", options.read_timeout_ms, 1));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "pool_size", options.pool_size, 1));
  if (!options.ca_file.empty() && !std::ifstream(options.ca_file).good())
    return Status::InvalidArgument("Pub/Sub client: cannot read ca_file '" + options.ca_file + "'");
  IDEM_ASSIGN_OR_RETURN(BaseUrl url, http_internal::ParseBaseUrl(options.endpoint.url, "Pub/Sub endpoint"));
  if (!options.endpoint.bearer.empty())
    IDEM_RETURN_IF_ERROR(
        http_internal::CheckHeaderValue("Authorization", options.endpoint.bearer).WithContext("Pub/Sub access token"));
  RestOptions kept = options;
  if (kept.env == nullptr) kept.env = Env::Default();
  return std::unique_ptr<RestClient>(new RestClient(std::make_unique<Impl>(std::move(kept), std::move(url))));
}

Result<RestReply> RestClient::Call(std::string_view method, const std::string& path, const nlohmann::json* body) {
  Impl& im = *impl_;
  const std::string what = std::string(method) + " " + path + " at " + im.options.endpoint.url;
  const std::string payload =
      body == nullptr ? std::string() : body->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const http_internal::RetryPolicy policy{.max_attempts = im.options.max_attempts,
                                          .backoff_base_ms = im.options.backoff_base_ms,
                                          .backoff_max_ms = im.options.backoff_max_ms,
                                          .env = im.options.env};
  return http_internal::WithRetries<RestReply>(what, policy, [&](int attempt) {
    http_internal::Attempt<RestReply> a = im.Once(method, path, body == nullptr ? nullptr : &payload);
    if (a.reply) a.reply->attempts = attempt;
    return a;
  });
}

const std::string& RestClient::endpoint() const { return impl_->options.endpoint.url; }

}  // namespace idem::pubsub_internal
