// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// kafka:// URLs: the Source's and the Publisher's keys, on the one grammar of
// idem/url.h.
#include <algorithm>
#include <string>

#include "idem/kafka/source.h"
#include "idem/url.h"

namespace idem::kafka {

namespace {

// Source::ParseUrl; with need_topic false, a URL without ?topic= is read too
// (a publisher given its destinations per message).
Result<Source::Options> ParseKafkaUrl(std::string_view url, bool need_topic) {
  using Options = Source::Options;
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, idem::ParseUrl(url, "Kafka URL"));
  if (u.scheme != "kafka")
    return Status::InvalidArgument("not a Kafka URL: '" + RedactUrl(url) +
                                   "' (expected kafka://HOST:PORT[,...]?topic=T)");
  IDEM_RETURN_IF_ERROR(u.CheckKeys({"topic", "group", "id_header", "id_from_key", "client_id", "session_timeout_ms",
                                    "heartbeat_interval_ms", "max_poll_interval_ms", "auto_offset_reset",
                                    "revoke_wait_ms", "connect_timeout_ms", "keep_alive"}));
  if (u.has_user) return Status::InvalidArgument("a Kafka URL takes no user or password: '" + RedactUrl(url) + "'");
  if (u.path.size() > 1) return Status::InvalidArgument("a Kafka URL has no path: '" + RedactUrl(url) + "'");
  Options o;
  for (const ParsedUrl::Host& h : u.hosts) {
    if (!o.brokers.empty()) o.brokers += ",";
    o.brokers += h.host.find(':') != std::string::npos ? "[" + h.host + "]" : h.host;
    if (h.port != 0) o.brokers += ":" + std::to_string(h.port);
  }
  o.topic = u.Get("topic");
  if (o.topic.empty() && need_topic)
    return Status::InvalidArgument("a Kafka URL needs ?topic=NAME: '" + RedactUrl(url) + "'");
  o.group = u.Get("group", "idem");
  o.id_header = u.Get("id_header", o.id_header);
  IDEM_ASSIGN_OR_RETURN(o.id_from_key, u.GetBool("id_from_key", o.id_from_key));
  o.client_id = u.Get("client_id", o.client_id);
  IDEM_ASSIGN_OR_RETURN(o.session_timeout_ms, u.GetInt("session_timeout_ms", o.session_timeout_ms, 100, 3'600'000));
  IDEM_ASSIGN_OR_RETURN(
      o.heartbeat_interval_ms,
      u.GetInt("heartbeat_interval_ms", std::clamp<int64_t>(o.session_timeout_ms / 4, 50, 1'000), 1, 3'600'000));
  IDEM_ASSIGN_OR_RETURN(o.max_poll_interval_ms, u.GetInt("max_poll_interval_ms", o.max_poll_interval_ms, 1, INT32_MAX));
  o.auto_offset_reset = u.Get("auto_offset_reset", o.auto_offset_reset);
  if (o.auto_offset_reset != "earliest" && o.auto_offset_reset != "latest")
    return Status::InvalidArgument("auto_offset_reset must be earliest or latest, got '" + o.auto_offset_reset +
                                   "' in '" + RedactUrl(url) + "'");
  IDEM_ASSIGN_OR_RETURN(o.revoke_wait_ms, u.GetInt("revoke_wait_ms", o.revoke_wait_ms, 0, 3'600'000));
  IDEM_ASSIGN_OR_RETURN(o.connect_timeout_ms, u.GetInt("connect_timeout_ms", 5'000, 100, 600'000));
  IDEM_ASSIGN_OR_RETURN(o.keep_alive, u.GetBool("keep_alive", o.keep_alive));
  return o;
}

}  // namespace

Result<Source::Options> Source::ParseUrl(std::string_view url) { return ParseKafkaUrl(url, /*need_topic=*/true); }

Result<Publisher::Options> Publisher::ParseUrl(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(Source::Options s, ParseKafkaUrl(url, /*need_topic=*/false));
  Options o;
  o.brokers = s.brokers;
  o.topic = s.topic;
  o.id_header = s.id_header;
  o.connect_timeout_ms = s.connect_timeout_ms;
  return o;
}

}  // namespace idem::kafka
