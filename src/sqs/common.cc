// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "sqs/common.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>

#include "core/header_codec.h"
#include "core/options_check.h"
#include "core/wire_format.h"
#include "http/base64.h"
#include "idem/publisher.h"

namespace idem::sqs_internal {

using aws_internal::JsonClient;
using aws_internal::ServiceError;
using nlohmann::json;

namespace {

bool Contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

bool IsQueueUrl(std::string_view q) { return q.starts_with("http://") || q.starts_with("https://"); }

// "https://host[:port]" of a queue URL.
std::string Origin(std::string_view url) {
  const size_t host = url.find("://") + 3;
  const size_t slash = url.find('/', host);
  return std::string(url.substr(0, slash));
}

std::string LastSegment(std::string_view url) {
  while (url.ends_with('/')) url.remove_suffix(1);
  const size_t slash = url.rfind('/');
  return std::string(slash == std::string_view::npos ? url : url.substr(slash + 1));
}

std::string RandomHex(int bytes) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  char buf[3];
  for (int i = 0; i < bytes; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned>(rng() & 0xff));
    out += buf;
  }
  return out;
}

// The id as a MessageDeduplicationId: 1-128 of '!'..'~', else its hash.
std::string DeduplicationId(std::string_view id) {
  const bool plain =
      !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c <= '~'; });
  return plain ? std::string(id) : std::string(kHashedKeyPrefix) + ToHex(FingerprintOf(id));
}

json TextOrBinary(std::string_view value) {
  if (IsSqsText(value) && !value.empty()) return {{"DataType", "String"}, {"StringValue", value}};
  return {{"DataType", "Binary"}, {"BinaryValue", http_internal::Base64Encode(value)}};
}

// An attribute's value as bytes (String / Number as written, Binary
// decoded); nullopt for a Binary value that is not base64.
std::optional<std::string> AttributeBytes(const json& a) {
  const std::string type = a.value("DataType", std::string());
  if (type.starts_with("Binary")) {
    const std::string b64 = a.value("BinaryValue", std::string());
    if (b64.empty()) return std::string();
    return http_internal::Base64Decode(b64);
  }
  return a.value("StringValue", std::string());
}

}  // namespace

int64_t Seconds(int64_t ms, int64_t max_s) {
  return std::clamp<int64_t>((std::max<int64_t>(ms, 0) + 999) / 1000, 0, max_s);
}

bool IsStaleReceipt(const ServiceError& e) {
  return Contains(e.type, "ReceiptHandleIsInvalid") || Contains(e.type, "MessageNotInflight") ||
         (Contains(e.type, "InvalidParameterValue") && Contains(e.message, "ReceiptHandle"));
}

Status ErrorStatus(const ServiceError& e, std::string_view what, bool receipt_call) {
  if (receipt_call && IsStaleReceipt(e))
    return Status::LeaseLost(std::string(what) + ": SQS no longer takes the receipt handle (" + e.type +
                             (e.message.empty() ? "" : ": " + e.message) +
                             "): the message was received again or deleted");
  return aws_internal::ToStatus(e, what);
}

std::vector<Status> BatchStatuses(const json& answer, size_t n, std::string_view what,
                                  const std::function<Status(const ServiceError&)>& failed) {
  std::vector<Status> out(n, Status::InDoubt(std::string(what) + ": the answer has no result for this entry"));
  auto index = [n](const json& e) -> std::optional<size_t> {
    const std::string id = e.value("Id", std::string());
    auto v = wire_internal::ParseProducerTime(id);
    if (!v || *v < 0 || static_cast<size_t>(*v) >= n) return std::nullopt;
    return static_cast<size_t>(*v);
  };
  if (answer.contains("Successful") && answer["Successful"].is_array())
    for (const json& e : answer["Successful"])
      if (auto i = index(e)) out[*i] = Status::OK();
  if (answer.contains("Failed") && answer["Failed"].is_array())
    for (const json& e : answer["Failed"])
      if (auto i = index(e))
        out[*i] = failed({.http_status = e.value("SenderFault", true) ? 400 : 500,
                          .type = e.value("Code", std::string("InternalError")),
                          .message = e.value("Message", std::string()),
                          .body = e});
  return out;
}

Result<json> Call(JsonClient& client, std::string_view operation, const json& input, std::string_view what,
                  bool receipt_call, int64_t extra_wait_ms) {
  auto r = client.Call(operation, input, extra_wait_ms);
  if (!r.ok()) return r.status().WithContext(std::string(what));
  if (r->error) return ErrorStatus(*r->error, what, receipt_call);
  return std::move(r->body);
}

Result<Queue> LookUp(JsonClient& client, std::string_view queue, bool create) {
  Queue q;
  if (IsQueueUrl(queue)) {
    q.url = std::string(queue);
    q.name = LastSegment(queue);
  } else {
    q.name = std::string(queue);
    const std::string where = "queue '" + q.name + "' in " + client.region() + " at " + client.endpoint();
    auto found = Call(client, "GetQueueUrl", {{"QueueName", q.name}}, "SQS GetQueueUrl of " + where);
    if (!found.ok() && found.status().code() == Code::kNotFound && create) {
      json input = {{"QueueName", q.name}};
      if (q.name.ends_with(".fifo")) input["Attributes"] = {{"FifoQueue", "true"}};
      found = Call(client, "CreateQueue", input, "SQS CreateQueue of " + where);
    }
    IDEM_ASSIGN_OR_RETURN(json got, std::move(found));
    q.url = got.value("QueueUrl", std::string());
    if (q.url.empty()) return Status::Internal("SQS GetQueueUrl of '" + q.name + "': no QueueUrl in the answer");
  }
  const std::string what = "SQS GetQueueAttributes of queue '" + q.name + "' at " + client.endpoint();
  IDEM_ASSIGN_OR_RETURN(json attrs,
                        Call(client, "GetQueueAttributes",
                             {{"QueueUrl", q.url}, {"AttributeNames", {"FifoQueue", "MessageRetentionPeriod"}}}, what));
  const json& a = attrs.contains("Attributes") ? attrs["Attributes"] : json::object();
  q.fifo = a.value("FifoQueue", std::string()) == "true" || q.name.ends_with(".fifo");
  const std::string retention = a.value("MessageRetentionPeriod", std::string("345600"));
  int64_t seconds = 345'600;
  if (auto v = wire_internal::ParseProducerTime(retention)) seconds = *v;
  q.retention_ms = seconds * 1000;
  return q;
}

Result<Connection> Connect(std::string_view what_view, const sqs::ConnectOptions& o, std::string_view queue,
                           bool create) {
  const std::string what(what_view);
  IDEM_RETURN_IF_ERROR(options_internal::InRange(what, "connect_timeout_ms", o.connect_timeout_ms, 1, 3'600'000));
  IDEM_RETURN_IF_ERROR(options_internal::InRange(what, "read_timeout_ms", o.read_timeout_ms, 1, 3'600'000));
  IDEM_RETURN_IF_ERROR(options_internal::InRange(what, "max_attempts", o.max_attempts, 1, 100));
  IDEM_RETURN_IF_ERROR(options_internal::InRange(what, "pool_size", o.pool_size, 1, 1'000));
  aws_internal::CredentialQuery cq;
  cq.given = {
      .access_key_id = o.access_key_id, .secret_access_key = o.secret_access_key, .session_token = o.session_token};
  cq.profile = o.profile;
  auto creds = aws_internal::FindCredentials(cq);
  if (!creds.ok()) return creds.status().WithContext(what);
  auto region = aws_internal::FindRegion(o.region, cq);
  if (!region.ok()) return region.status().WithContext(what);
  aws_internal::ClientOptions co;
  co.region = *region;
  co.endpoint = o.endpoint.empty() && IsQueueUrl(queue) ? Origin(queue) : o.endpoint;
  co.credentials = std::move(*creds);
  co.ca_file = o.ca_file;
  co.connect_timeout_ms = o.connect_timeout_ms;
  co.read_timeout_ms = o.read_timeout_ms;
  co.pool_size = o.pool_size;
  co.max_attempts = o.max_attempts;
  co.env = o.env;
  auto client = JsonClient::Open(
      {.signing_name = "sqs", .target_prefix = "AmazonSQS", .content_type = "application/x-amz-json-1.0"}, co);
  if (!client.ok()) return client.status().WithContext(what);
  Connection c{.client = std::move(*client), .queue = {}};
  if (!queue.empty()) {
    auto q = LookUp(*c.client, queue, create);
    if (!q.ok()) return q.status().WithContext(what);
    c.queue = std::move(*q);
  }
  return c;
}

Result<UrlParts> ParseSqsUrl(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, idem::ParseUrl(url, "SQS URL", UrlForm::kFile));
  if (u.scheme != "sqs")
    return Status::InvalidArgument("not an SQS URL: '" + RedactUrl(url) + "' (expected sqs://QUEUE?region=R)");
  IDEM_RETURN_IF_ERROR(u.CheckKeys({"queue_url", "region", "endpoint", "profile", "id_attribute", "message_id_fallback",
                                    "lease_ms", "connect_timeout_ms", "read_timeout_ms", "max_attempts", "pool_size",
                                    "group_id", "deduplicate_by_id", "create_queue"}));
  UrlParts p;
  std::string name = u.path;
  while (name.starts_with('/')) name.erase(0, 1);
  const std::string queue_url = u.Get("queue_url");
  if (!name.empty() && !queue_url.empty())
    return Status::InvalidArgument("SQS URL '" + RedactUrl(url) + "' names a queue twice (QUEUE and queue_url)");
  p.queue = queue_url.empty() ? name : queue_url;
  if (!queue_url.empty() && !IsQueueUrl(queue_url))
    return Status::InvalidArgument("SQS URL '" + RedactUrl(url) + "': queue_url must be http:// or https://");
  IDEM_ASSIGN_OR_RETURN(p.create_queue, u.GetBool("create_queue", false));
  p.connect.region = u.Get("region");
  p.connect.endpoint = u.Get("endpoint");
  p.connect.profile = u.Get("profile");
  IDEM_ASSIGN_OR_RETURN(p.connect.connect_timeout_ms,
                        u.GetInt("connect_timeout_ms", p.connect.connect_timeout_ms, 1, 3'600'000));
  IDEM_ASSIGN_OR_RETURN(p.connect.read_timeout_ms,
                        u.GetInt("read_timeout_ms", p.connect.read_timeout_ms, 1, 3'600'000));
  IDEM_ASSIGN_OR_RETURN(int64_t attempts, u.GetInt("max_attempts", p.connect.max_attempts, 1, 100));
  p.connect.max_attempts = static_cast<int>(attempts);
  IDEM_ASSIGN_OR_RETURN(int64_t pool, u.GetInt("pool_size", p.connect.pool_size, 1, 1'000));
  p.connect.pool_size = static_cast<int>(pool);
  p.url = std::move(u);
  return p;
}

bool IsSqsText(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    uint32_t cp = 0;
    int len = 0;
    if (p[i] < 0x80) {
      cp = p[i];
      len = 1;
    } else if ((p[i] & 0xe0) == 0xc0) {
      cp = p[i] & 0x1f;
      len = 2;
    } else if ((p[i] & 0xf0) == 0xe0) {
      cp = p[i] & 0x0f;
      len = 3;
    } else if ((p[i] & 0xf8) == 0xf0) {
      cp = p[i] & 0x07;
      len = 4;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len]) return false;  // overlong
    const bool ok = cp == 0x9 || cp == 0xa || cp == 0xd || (cp >= 0x20 && cp <= 0xd7ff) ||
                    (cp >= 0xe000 && cp <= 0xfffd) || (cp >= 0x10000 && cp <= 0x10ffff);
    if (!ok) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

Result<json> EncodeMessage(const Message& m, const EncodeOptions& o) {
  IDEM_RETURN_IF_ERROR(ValidateId(m.id));
  json attrs = json::object();
  attrs[std::string(o.id_attribute)] = TextOrBinary(m.id);
  if (m.producer_time_ms)
    attrs[std::string(kProducerTimeHeader)] = {{"DataType", "Number"},
                                               {"StringValue", std::to_string(*m.producer_time_ms)}};
  if (!m.headers.empty())
    attrs[std::string(kHeadersAttribute)] = {
        {"DataType", "Binary"}, {"BinaryValue", http_internal::Base64Encode(internal::EncodeHeaders(m.headers))}};
  json out = json::object();
  if (!m.payload.empty() && IsSqsText(m.payload)) {
    out["MessageBody"] = m.payload;
  } else {
    // An empty body is not allowed: "=" is no base64 of anything else.
    out["MessageBody"] = m.payload.empty() ? std::string("=") : http_internal::Base64Encode(m.payload);
    attrs[std::string(kBodyAttribute)] = {{"DataType", "String"}, {"StringValue", "base64"}};
  }
  out["MessageAttributes"] = std::move(attrs);
  if (o.fifo) {
    out["MessageDeduplicationId"] = o.deduplicate_by_id ? DeduplicationId(m.id) : RandomHex(16);
    std::string group(o.key);
    if (group.empty()) {
      if (auto k = m.Header(kOrderingKeyHeader)) group = std::string(*k);
    }
    if (group.empty()) group = std::string(o.group_id);
    if (group.empty()) group = RandomHex(16);
    // MessageGroupId: 1-128 of '!'..'~'; another key goes by its hash.
    out["MessageGroupId"] = DeduplicationId(group);
  }
  return out;
}

Message DecodeMessage(const json& sm, std::string_view id_attribute, bool message_id_fallback) {
  Message m;
  std::string problem;
  bool has_id = false;
  bool base64_body = false;
  wire_internal::ProducerTimeReader time;
  std::vector<std::pair<std::string, std::string>> extra;
  if (sm.contains("MessageAttributes") && sm["MessageAttributes"].is_object()) {
    for (const auto& [name, a] : sm["MessageAttributes"].items()) {
      std::optional<std::string> bytes = AttributeBytes(a);
      if (!bytes) {
        problem = "message attribute '" + name + "' is not valid base64";
        continue;
      }
      if (name == id_attribute) {
        m.id = std::move(*bytes);
        has_id = true;
      } else if (name == kHeadersAttribute) {
        if (auto h = internal::DecodeHeaders(*bytes)) {
          for (auto& kv : *h) m.headers.push_back(std::move(kv));
        } else {
          problem = "message attribute 'idem-headers' is not idem's header encoding";
        }
      } else if (name == kBodyAttribute) {
        base64_body = *bytes == "base64";
      } else if (time.Offer(name, *bytes)) {
        // the producer time
      } else {
        extra.emplace_back(name, std::move(*bytes));
      }
    }
  }
  for (auto& kv : extra) m.headers.push_back(std::move(kv));
  m.producer_time_ms = time.time();
  const std::string body = sm.value("Body", std::string());
  if (base64_body) {
    if (body == "=") {
      m.payload.clear();
    } else if (auto b = http_internal::Base64Decode(body)) {
      m.payload = std::move(*b);
    } else {
      m.payload = body;
      problem = "the body is marked base64 (idem-body) but is not";
    }
  } else {
    m.payload = body;
  }
  const std::string sqs_id = sm.value("MessageId", std::string());
  if (!has_id) {
    if (message_id_fallback && !sqs_id.empty()) {
      m.id = sqs_id;
    } else {
      problem =
          "SQS message " + sqs_id + " has no message attribute '" + std::string(id_attribute) + "' (the message id)";
    }
  }
  if (!problem.empty()) {
    // The Consumer dead-letters a delivery with an empty id at once.
    m.id.clear();
    m.headers.emplace_back(std::string(kErrorHeader), problem);
  }
  int64_t count = 0;
  if (sm.contains("Attributes") && sm["Attributes"].is_object()) {
    if (auto c = wire_internal::ParseProducerTime(sm["Attributes"].value("ApproximateReceiveCount", std::string())))
      count = *c;
  }
  m.attempt = static_cast<int>(std::clamp<int64_t>(count, 0, 1 << 30));
  return m;
}

}  // namespace idem::sqs_internal
