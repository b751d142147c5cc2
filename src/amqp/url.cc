// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// amqp:// URLs: the endpoint (amqp_internal::ParseEndpoint) and the Source's and the
// Publisher's query keys, on the one grammar of idem/url.h.
#include <limits>
#include <string>

#include "amqp/conn.h"
#include "core/options_check.h"
#include "idem/amqp/publisher.h"
#include "idem/amqp/source.h"
#include "idem/url.h"

namespace idem::amqp_internal {

std::string Endpoint::Where() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<Endpoint> ParseEndpoint(std::string_view url) {
  const std::string scheme = UrlScheme(url);
  if (scheme == "amqps") return Status::InvalidArgument("amqp url: amqps (TLS) is not supported");
  if (scheme != "amqp" || !url.substr(scheme.size()).starts_with("://"))
    return Status::InvalidArgument("amqp url: must start with amqp://");
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, idem::ParseUrl(url, "amqp url"));
  if (u.hosts.size() != 1)
    return Status::InvalidArgument("amqp url: name one host, not " + std::to_string(u.hosts.size()));
  Endpoint ep;
  ep.user = "guest";
  ep.password = "guest";
  if (u.has_user) {
    if (u.user.empty()) return Status::InvalidArgument("amqp url: the user before '@' is empty");
    ep.user = u.user;
    ep.password = u.password;  // "" when the URL gives none
  }
  ep.host = u.hosts[0].host;
  if (u.hosts[0].port != 0) ep.port = u.hosts[0].port;
  // "/VHOST", decoded: "/%2f" is the vhost "/"; no path, or "/" alone, too.
  if (u.path.size() > 1) ep.vhost = u.path.substr(1);
  return ep;
}

Status CheckQueueFields(std::string_view what, std::string_view queue, std::string_view queue_type) {
  if (queue.size() > 255)
    return options_internal::Refuse(what, "queue", "at most 255 bytes", std::to_string(queue.size()) + " bytes");
  if (queue_type != "classic" && queue_type != "quorum" && !queue_type.empty())
    return options_internal::Refuse(what, "queue_type", "classic or quorum", "'" + std::string(queue_type) + "'");
  return Status::OK();
}

}  // namespace idem::amqp_internal

namespace idem::amqp {

namespace {

// The keys of an amqp:// source or publisher URL (a publisher's may name no
// queue: it is then given a destination per message).
Result<ParsedUrl> ParseQuery(std::string_view url, bool need_queue) {
  IDEM_RETURN_IF_ERROR(amqp_internal::ParseEndpoint(url).status());
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, idem::ParseUrl(url, "amqp url"));
  IDEM_RETURN_IF_ERROR(u.CheckKeys({"queue", "id_header", "prefetch", "lease_ms", "queue_type", "declare_queue",
                                    "heartbeat_ms", "connect_timeout_ms", "max_nack_delay_ms"}));
  if (u.Get("queue").empty() && need_queue)
    return Status::InvalidArgument("an amqp:// URL needs ?queue=NAME: '" + RedactUrl(url) + "'");
  return u;
}

Result<Source::Options> ParseSourceUrl(std::string_view url, bool need_queue) {
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, ParseQuery(url, need_queue));
  using Options = Source::Options;
  Options o;
  o.url = std::string(url.substr(0, url.find('?')));
  o.queue = u.Get("queue");
  o.id_header = u.Get("id_header");
  IDEM_ASSIGN_OR_RETURN(int64_t prefetch, u.GetInt("prefetch", o.prefetch, 1, 65'535));
  o.prefetch = static_cast<int>(prefetch);
  IDEM_ASSIGN_OR_RETURN(o.lease_ms, u.GetInt("lease_ms", o.lease_ms, 0, std::numeric_limits<int64_t>::max() / 2));
  o.queue_type = u.Get("queue_type", o.queue_type);
  IDEM_ASSIGN_OR_RETURN(o.declare_queue, u.GetBool("declare_queue", o.declare_queue));
  IDEM_ASSIGN_OR_RETURN(o.heartbeat_ms, u.GetInt("heartbeat_ms", o.heartbeat_ms, 0, 65'535'000));
  IDEM_ASSIGN_OR_RETURN(o.connect_timeout_ms, u.GetInt("connect_timeout_ms", o.connect_timeout_ms, 1, 3'600'000));
  IDEM_ASSIGN_OR_RETURN(o.max_nack_delay_ms,
                        u.GetInt("max_nack_delay_ms", o.max_nack_delay_ms, 0, std::numeric_limits<int64_t>::max() / 2));
  return o;
}

}  // namespace

Result<Source::Options> Source::ParseUrl(std::string_view url) { return ParseSourceUrl(url, /*need_queue=*/true); }

Result<Publisher::Options> Publisher::ParseUrl(std::string_view url) {
  // One URL opens both ends: the consumer's keys are checked the same way.
  IDEM_ASSIGN_OR_RETURN(Source::Options s, ParseSourceUrl(url, /*need_queue=*/false));
  return Options{.url = s.url,
                 .queue = s.queue,
                 .declare_queue = s.declare_queue && !s.queue.empty(),
                 .queue_type = s.queue_type,
                 .connect_timeout_ms = s.connect_timeout_ms};
}

}  // namespace idem::amqp
