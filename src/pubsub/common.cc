// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "pubsub/common.h"

#include <cctype>

namespace idem::pubsub_internal {

Result<ParsedUrl> ParseConnectionUrl(std::string_view url, pubsub::Connection& c, std::string* rest) {
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, idem::ParseUrl(url, "Pub/Sub URL"));
  if (u.scheme != "pubsub")
    return Status::InvalidArgument("not a Pub/Sub URL: '" + RedactUrl(url) +
                                   "' (expected pubsub://PROJECT/SUBSCRIPTION or pubsub://PROJECT?topic=T)");
  if (u.has_user || u.hosts.size() != 1 || u.hosts[0].port != 0 || u.hosts[0].host.empty())
    return Status::InvalidArgument("a Pub/Sub URL names one project and no port or user: '" + RedactUrl(url) + "'");
  c.project = u.hosts[0].host;
  std::string_view path = u.path;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  if (path.find('/') != std::string_view::npos)
    return Status::InvalidArgument("a Pub/Sub URL's path is one subscription id: '" + RedactUrl(url) + "'");
  *rest = std::string(path);
  c.endpoint = u.Get("endpoint");
  c.token_file = u.Get("token_file");
  c.ca_file = u.Get("ca_file");
  IDEM_ASSIGN_OR_RETURN(c.connect_timeout_ms, u.GetInt("connect_timeout_ms", c.connect_timeout_ms, 1, 600'000));
  IDEM_ASSIGN_OR_RETURN(c.read_timeout_ms, u.GetInt("read_timeout_ms", c.read_timeout_ms, 1, 600'000));
  IDEM_ASSIGN_OR_RETURN(int64_t attempts, u.GetInt("max_attempts", c.max_attempts, 1, 100));
  c.max_attempts = static_cast<int>(attempts);
  IDEM_ASSIGN_OR_RETURN(int64_t pool, u.GetInt("pool_size", c.pool_size, 1, 1'000));
  c.pool_size = static_cast<int>(pool);
  return u;
}

Result<std::unique_ptr<RestClient>> OpenClient(const pubsub::Connection& c, Env* env) {
  if (c.project.empty()) return Status::InvalidArgument("Pub/Sub: Options::connection.project must not be empty");
  if (c.project.find_first_of("/?#% ") != std::string::npos)
    return Status::InvalidArgument("Pub/Sub: project id '" + Printable(c.project) + "' is not a project id");
  IDEM_ASSIGN_OR_RETURN(Endpoint ep, FindEndpoint(c.endpoint, c.access_token, c.token_file));
  return RestClient::Open({.endpoint = std::move(ep),
                           .ca_file = c.ca_file,
                           .connect_timeout_ms = c.connect_timeout_ms,
                           .read_timeout_ms = c.read_timeout_ms,
                           .pool_size = c.pool_size,
                           .max_attempts = c.max_attempts,
                           .env = env});
}

Status CheckResourceId(std::string_view what, std::string_view id) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("Pub/Sub " + std::string(what) + " id '" + Printable(id) + "' " + std::string(why));
  };
  if (id.size() < 3 || id.size() > 255) return bad("must be 3 to 255 characters long");
  if (!std::isalpha(static_cast<unsigned char>(id[0]))) return bad("must start with a letter");
  if (id.starts_with("goog")) return bad("must not start with 'goog'");
  for (char ch : id) {
    const unsigned char u = static_cast<unsigned char>(ch);
    if (!std::isalnum(u) && ch != '-' && ch != '_' && ch != '.' && ch != '~' && ch != '+' && ch != '%')
      return bad("may hold only letters, digits and - _ . ~ + %");
  }
  return Status::OK();
}

std::string TopicName(std::string_view project, std::string_view topic) {
  return "projects/" + std::string(project) + "/topics/" + std::string(topic);
}
std::string SubscriptionName(std::string_view project, std::string_view sub) {
  return "projects/" + std::string(project) + "/subscriptions/" + std::string(sub);
}

Status ReplyStatus(const Result<RestReply>& r, std::string_view what) {
  if (!r.ok()) return r.status();
  if (r->error) return ToStatus(*r->error, what);
  return Status::OK();
}

Status CreateTopic(RestClient& client, std::string_view project, std::string_view topic) {
  IDEM_RETURN_IF_ERROR(CheckResourceId("topic", topic));
  const nlohmann::json body = nlohmann::json::object();
  auto r = client.Call("PUT", "/v1/" + TopicName(project, topic), &body);
  if (r.ok() && r->error && r->error->status == "ALREADY_EXISTS") return Status::OK();
  return ReplyStatus(r, "Pub/Sub create topic '" + TopicName(project, topic) + "' at " + client.endpoint());
}

Result<nlohmann::json> GetResource(RestClient& client, const std::string& path, std::string_view what) {
  auto r = client.Call("GET", "/v1/" + path);
  IDEM_RETURN_IF_ERROR(ReplyStatus(r, "Pub/Sub " + std::string(what) + " '" + path + "' at " + client.endpoint()));
  return std::move(r->body);
}

}  // namespace idem::pubsub_internal
