// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "aws/client.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <utility>

#include "core/env_var.h"
#include "core/options_check.h"
#include "http/pool.h"
#include "http/retry.h"

namespace idem::aws_internal {

namespace {

using http_internal::BaseUrl;
using http_internal::ConnectionPool;

std::string GetEnv(const char* name) { return internal::EnvVar(name); }

std::string Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

std::string HomeFile(const char* env_name, const std::string& given, const char* under_home) {
  if (!given.empty()) return given;
  if (std::string v = GetEnv(env_name); !v.empty()) return v;
  const std::string home = GetEnv("HOME");
  return home.empty() ? std::string() : home + "/" + under_home;
}

// The keys of one section of an INI file (the shared credentials and config
// files): `section` as written between the brackets. Empty when the file or
// the section is absent.
std::vector<std::pair<std::string, std::string>> IniSection(const std::string& path, const std::string& section) {
  std::vector<std::pair<std::string, std::string>> out;
  std::ifstream in(path);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    const std::string t = Trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      inside = Trim(std::string_view(t).substr(1, t.size() - 2)) == section;
      continue;
    }
    if (!inside) continue;
    const size_t eq = t.find('=');
    if (eq == std::string::npos) continue;
    out.emplace_back(Trim(std::string_view(t).substr(0, eq)), Trim(std::string_view(t).substr(eq + 1)));
  }
  return out;
}

std::string Lookup(const std::vector<std::pair<std::string, std::string>>& kv, std::string_view key) {
  for (const auto& [k, v] : kv)
    if (k == key) return v;
  return std::string();
}

std::string Profile(const CredentialQuery& q) {
  if (!q.profile.empty()) return q.profile;
  if (std::string p = GetEnv("AWS_PROFILE"); !p.empty()) return p;
  return "default";
}

// The config file names sections "[profile NAME]", except "[default]".
std::string ConfigSection(const std::string& profile) { return profile == "default" ? profile : "profile " + profile; }

// Credentials from one source, or nullopt when it has no key id.
Result<std::optional<Credentials>> From(std::string key_id, std::string secret, std::string token,
                                        const std::string& where) {
  if (key_id.empty()) return std::optional<Credentials>();
  if (secret.empty())
    return Status::InvalidArgument("AWS credentials in " + where + " have an access key id (" + key_id +
                                   ") but no secret access key");
  return std::optional<Credentials>(Credentials{std::move(key_id), std::move(secret), std::move(token)});
}

std::string AmzDate(int64_t now_ms) {
  const std::time_t t = static_cast<std::time_t>(now_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

bool Contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

}  // namespace

Result<Credentials> FindCredentials(const CredentialQuery& query) {
  const auto& g = query.given;
  IDEM_ASSIGN_OR_RETURN(auto given, From(g.access_key_id, g.secret_access_key, g.session_token, "the URL or options"));
  if (given) return *given;
  IDEM_ASSIGN_OR_RETURN(auto env, From(GetEnv("AWS_ACCESS_KEY_ID"), GetEnv("AWS_SECRET_ACCESS_KEY"),
                                       GetEnv("AWS_SESSION_TOKEN"), "the environment (AWS_ACCESS_KEY_ID)"));
  if (env) return *env;
  const std::string profile = Profile(query);
  const std::string cred_file = HomeFile("AWS_SHARED_CREDENTIALS_FILE", query.credentials_file, ".aws/credentials");
  const std::string conf_file = HomeFile("AWS_CONFIG_FILE", query.config_file, ".aws/config");
  for (const auto& [file, section] : {std::pair{cred_file, profile}, std::pair{conf_file, ConfigSection(profile)}}) {
    if (file.empty()) continue;
    const auto kv = IniSection(file, section);
    IDEM_ASSIGN_OR_RETURN(auto found, From(Lookup(kv, "aws_access_key_id"), Lookup(kv, "aws_secret_access_key"),
                                           Lookup(kv, "aws_session_token"), file + " [" + section + "]"));
    if (found) return *found;
  }
  return Status::NotFound(
      "no AWS credentials found: looked in the URL, the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), " +
      (cred_file.empty() ? std::string("no shared credentials file ($HOME unset)")
                         : cred_file + " and " + conf_file + " (profile '" + profile + "')"));
}

Result<std::string> FindRegion(std::string_view given, const CredentialQuery& query) {
  std::string region(given), where = "the URL or options";
  if (region.empty()) region = GetEnv("AWS_REGION"), where = "AWS_REGION";
  if (region.empty()) region = GetEnv("AWS_DEFAULT_REGION"), where = "AWS_DEFAULT_REGION";
  const std::string profile = Profile(query);
  const std::string conf_file = HomeFile("AWS_CONFIG_FILE", query.config_file, ".aws/config");
  if (region.empty() && !conf_file.empty()) {
    region = Lookup(IniSection(conf_file, ConfigSection(profile)), "region");
    where = conf_file;
  }
  if (region.empty())
    return Status::NotFound(
        "no AWS region: give one in the URL (?region=us-east-1), or set AWS_REGION, or a region "
        "in " +
        (conf_file.empty() ? std::string("~/.aws/config") : conf_file) + " (profile '" + profile + "')");
  const bool ok = std::all_of(region.begin(), region.end(),
                              [](unsigned char c) { return std::islower(c) != 0 || std::isdigit(c) != 0 || c == '-'; });
  if (!ok || region.size() > 64)
    return Status::InvalidArgument("AWS region '" + region.substr(0, 64) + "' (from " + where +
                                   ") is not a region name (lowercase letters, digits and dashes, like us-east-1)");
  return region;
}

bool Retryable(const ServiceError& e) {
  if (e.http_status >= 500) return true;
  for (std::string_view t :
       {"Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled", "RequestThrottledException",
        "ProvisionedThroughputExceededException", "RequestLimitExceeded", "TooManyRequestsException",
        "LimitExceededException", "InternalServerError", "InternalFailure", "ServiceUnavailable",
        "TransactionInProgressException"})
    if (e.type == t) return true;
  return false;
}

Status ToStatus(const ServiceError& e, std::string_view what_view) {
  const std::string what(what_view);
  const std::string said = e.type + (e.message.empty() ? std::string() : ": " + e.message);
  if (Retryable(e) && e.http_status < 500)
    return Status::Busy(what + ": throttled by the service (" + said + "); retry later");
  if (e.http_status >= 500)
    return Status::Unavailable(what + ": the service failed (HTTP " + std::to_string(e.http_status) + ", " + said +
                               ")");
  if (Contains(e.type, "NotFound") || Contains(e.type, "NonExistent") || e.type == "QueueDoesNotExist")
    return Status::NotFound(what + ": " + said);
  if (e.type == "UnrecognizedClientException" || e.type == "InvalidClientTokenId" ||
      e.type == "InvalidSignatureException" || e.type == "SignatureDoesNotMatch" || e.type == "AccessDenied" ||
      e.type == "AccessDeniedException" || e.type == "MissingAuthenticationToken" ||
      e.type == "ExpiredTokenException" || e.type == "IncompleteSignature")
    return Status::InvalidArgument(what + ": the credentials were refused (" + said +
                                   "): check the access key, the secret and the region");
  return Status::InvalidArgument(what + ": " + said);
}

struct JsonClient::Impl {
  Service service;
  ClientOptions options;
  std::string endpoint;  // as given or made, for messages
  ConnectionPool pool;

  Impl(Service s, ClientOptions o, std::string ep, BaseUrl url)
      : service(std::move(s)),
        options(std::move(o)),
        endpoint(std::move(ep)),
        pool(std::move(url), {.ca_file = options.ca_file,
                              .connect_timeout_ms = options.connect_timeout_ms,
                              .read_timeout_ms = options.read_timeout_ms,
                              .pool_size = options.pool_size}) {}

  // One request: the reply, or why there was none (`sent`: it may have
  // reached the server).
  struct Attempt {
    std::optional<Reply> reply;
    std::string failure;
    bool sent = false;
    bool permanent = false;
  };

  Attempt Once(std::string_view operation, const std::string& payload, int64_t extra_wait_ms) {
    Attempt out;
    Request req;
    req.method = "POST";
    req.path = pool.url().path.empty() ? "/" : pool.url().path + "/";
    req.headers = {{"Host", pool.url().HostHeader()},
                   {"Content-Type", service.content_type},
                   {"X-Amz-Target", service.target_prefix + "." + std::string(operation)}};
    req.payload = payload;
    Result<Signed> s =
        Sign(req, options.credentials,
             {.region = options.region, .service = service.signing_name, .amz_date = AmzDate(options.env->NowMs())});
    if (!s.ok()) {
      out.failure = s.status().message();
      out.permanent = true;
      return out;
    }
    httplib::Headers headers;
    for (const auto& [k, v] : req.headers)
      if (k != "Host" && k != "Content-Type") headers.emplace(k, v);
    for (const auto& [k, v] : s->headers_to_add) headers.emplace(k, v);
    ConnectionPool::Exchange ex = pool.Send([&](httplib::ClientImpl& c) {
      c.set_read_timeout(std::chrono::milliseconds(options.read_timeout_ms + std::max<int64_t>(0, extra_wait_ms)));
      return c.Post(req.path, headers, payload, service.content_type);
    });
    if (!ex.response) {
      out.failure = ex.failure;
      out.sent = ex.sent;
      out.permanent = ex.permanent;
      return out;
    }
    const httplib::Response* r = &*ex.response;
    Reply reply;
    nlohmann::json body = r->body.empty() ? nlohmann::json::object()
                                          : nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (r->status >= 200 && r->status < 300 && !body.is_discarded()) {
      reply.body = std::move(body);
    } else {
      ServiceError e;
      e.http_status = r->status;
      if (!body.is_discarded() && body.is_object()) {
        std::string type = body.value("__type", std::string());
        // "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
        // "com.amazon.coral.service#UnrecognizedClientException"
        if (size_t hash = type.rfind('#'); hash != std::string::npos) type = type.substr(hash + 1);
        e.type = type;
        e.message = body.value("message", body.value("Message", std::string()));
        e.body = std::move(body);
      } else {
        e.type = r->status >= 200 && r->status < 300 ? "MalformedResponse" : "HTTP" + std::to_string(r->status);
        e.message = r->body.substr(0, 300);
      }
      // The header names the error too (SQS's query-compatible errors).
      if (std::string q = r->get_header_value("x-amzn-query-error"); e.type.empty() && !q.empty())
        e.type = q.substr(0, q.find(';'));
      reply.error = std::move(e);
    }
    out.reply = std::move(reply);
    return out;
  }
};

JsonClient::JsonClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JsonClient::~JsonClient() = default;

Result<std::unique_ptr<JsonClient>> JsonClient::Open(const Service& service, const ClientOptions& options) {
  using options_internal::AtLeast;
  const std::string what = "AWS " + service.signing_name + " client";
  if (options.region.empty()) return Status::InvalidArgument(what + ": no region");
  if (options.credentials.access_key_id.empty() || options.credentials.secret_access_key.empty())
    return Status::InvalidArgument(what + ": no credentials (an access key id and a secret access key)");
  IDEM_RETURN_IF_ERROR(AtLeast(what, "max_attempts", options.max_attempts, 1));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "backoff_base_ms", options.backoff_base_ms, 0));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "backoff_max_ms", options.backoff_max_ms, 0));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "connect_timeout_ms", options.connect_timeout_ms, 0));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "read_timeout_ms", options.read_timeout_ms, 1));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "pool_size", options.pool_size, 0));
  if (!options.ca_file.empty() && !std::ifstream(options.ca_file).good())
    return Status::InvalidArgument(what + ": cannot read ca_file '" + options.ca_file + "'");
  const std::string endpoint = options.endpoint.empty()
                                   ? "https://" + service.signing_name + "." + options.region + ".amazonaws.com"
                                   : options.endpoint;
  IDEM_ASSIGN_OR_RETURN(BaseUrl url, http_internal::ParseBaseUrl(endpoint, what + " endpoint"));
  ClientOptions kept = options;
  if (kept.env == nullptr) kept.env = Env::Default();
  return std::unique_ptr<JsonClient>(
      new JsonClient(std::make_unique<Impl>(service, std::move(kept), endpoint, std::move(url))));
}

Result<Reply> JsonClient::Call(std::string_view operation, const nlohmann::json& input, int64_t extra_wait_ms) {
  Impl& im = *impl_;
  const std::string what = im.service.target_prefix + "." + std::string(operation) + " at " + im.endpoint;
  const std::string payload = input.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const http_internal::RetryPolicy policy{.max_attempts = im.options.max_attempts,
                                          .backoff_base_ms = im.options.backoff_base_ms,
                                          .backoff_max_ms = im.options.backoff_max_ms,
                                          .env = im.options.env};
  return http_internal::WithRetries<Reply>(what, policy, [&](int attempt) {
    Impl::Attempt a = im.Once(operation, payload, extra_wait_ms);
    http_internal::Attempt<Reply> out{.sent = a.sent, .permanent = a.permanent, .failure = a.failure};
    if (a.reply) {
      a.reply->attempts = attempt;
      if (a.reply->error) {
        out.retry = Retryable(*a.reply->error);
        out.sent = a.reply->error->http_status >= 500;
        out.failure = a.reply->error->type + ": " + a.reply->error->message;
      }
      out.reply = std::move(a.reply);
    }
    return out;
  });
}

const std::string& JsonClient::endpoint() const { return impl_->endpoint; }
const std::string& JsonClient::region() const { return impl_->options.region; }

}  // namespace idem::aws_internal
