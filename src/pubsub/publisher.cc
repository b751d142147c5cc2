// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::pubsub::Publisher: projects.topics.publish in batches (the message
// form is in include/idem/pubsub/publisher.h).
#include "idem/pubsub/publisher.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/options_check.h"
#include "core/publish_batch.h"
#include "core/wire_format.h"
#include "http/base64.h"
#include "pubsub/common.h"
#include "pubsub/wire.h"

namespace idem::pubsub {
namespace {

using pubsub_internal::RestClient;

constexpr std::string_view kWhat = "Pub/Sub publisher";

// Sets attribute `name` to `value`, base64-encoded under the prefixed name
// when it is not text (src/pubsub/wire.h). False when either name is taken.
bool SetAttribute(nlohmann::json& attrs, const std::string& name, std::string_view value) {
  const std::string coded = std::string(pubsub_internal::kBase64AttributePrefix) + name;
  if (attrs.contains(name) || attrs.contains(coded)) return false;
  if (pubsub_internal::NeedsBase64(value))
    attrs[coded] = http_internal::Base64Encode(value);
  else
    attrs[name] = std::string(value);
  return true;
}

class PublisherImpl final : public Publisher {
 public:
  PublisherImpl(Options o, std::unique_ptr<RestClient> client) : o_(std::move(o)), client_(std::move(client)) {}

  Status Init() {
    if (o_.topic.empty()) return Status::OK();
    IDEM_RETURN_IF_ERROR(pubsub_internal::CheckResourceId("topic", o_.topic));
    if (o_.create) return pubsub_internal::CreateTopic(*client_, o_.connection.project, o_.topic);
    auto t =
        pubsub_internal::GetResource(*client_, pubsub_internal::TopicName(o_.connection.project, o_.topic), "topic");
    if (!t.ok() && t.status().code() == Code::kNotFound)
      return Status::NotFound(t.status().message() + " (create it, or open with create)");
    return t.status();
  }

  Status Publish(const Message& m) override {
    if (o_.topic.empty()) return publish_internal::NoChannel(kWhat, "topic");
    const Outgoing one{.message = &m};
    return PublishBatch(std::span<const Outgoing>(&one, 1))[0];
  }

  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override {
    std::vector<Status> out(batch.size());
    // The elements that can go, by topic, in order.
    std::map<std::string, std::vector<std::pair<size_t, nlohmann::json>>> by_topic;
    for (size_t i = 0; i < batch.size(); ++i) {
      auto dest = publish_internal::Destination(batch[i], o_.topic, kWhat, "topic");
      if (!dest.ok()) {
        out[i] = dest.status();
        continue;
      }
      if (Status s = pubsub_internal::CheckResourceId("topic", *dest); !s.ok()) {
        out[i] = s;
        continue;
      }
      auto encoded = Encode(*batch[i].message, batch[i].key);
      if (!encoded.ok()) {
        out[i] = encoded.status();
        continue;
      }
      by_topic[std::string(*dest)].emplace_back(i, std::move(*encoded));
    }
    for (auto& [topic, elements] : by_topic) {
      const std::string path = "/v1/" + pubsub_internal::TopicName(o_.connection.project, topic) + ":publish";
      for (size_t start = 0; start < elements.size(); start += static_cast<size_t>(o_.max_batch)) {
        const size_t end = std::min(elements.size(), start + static_cast<size_t>(o_.max_batch));
        nlohmann::json messages = nlohmann::json::array();
        for (size_t k = start; k < end; ++k) messages.push_back(std::move(elements[k].second));
        const nlohmann::json body = {{"messages", std::move(messages)}};
        Status s = Send(path, topic, body, end - start);
        for (size_t k = start; k < end; ++k) out[elements[k].first] = s;
      }
    }
    return out;
  }

  PublisherTraits traits() const override { return {.ordered_batch = false, .max_batch = o_.max_batch}; }
  std::string_view Channel() const override { return o_.topic; }

 private:
  // The message in Pub/Sub's form; kInvalidArgument for headers the
  // attributes cannot carry.
  Result<nlohmann::json> Encode(const Message& m, std::string_view key) const {
    nlohmann::json attrs = nlohmann::json::object();
    SetAttribute(attrs, o_.id_attribute, m.id);
    if (m.producer_time_ms) SetAttribute(attrs, std::string(kProducerTimeHeader), std::to_string(*m.producer_time_ms));
    std::string ordering(key);
    for (const auto& [name, value] : m.headers) {
      if (name == kOrderingKeyHeader) {
        if (ordering.empty()) ordering = value;
        continue;
      }
      auto refuse = [&, &header = name](std::string_view why) {
        return Status::InvalidArgument("Pub/Sub publish of " + Printable(m.id) + ": header '" + Printable(header) +
                                       "' " + std::string(why));
      };
      if (name.empty() || name.size() > 200) return refuse("must be 1 to 200 bytes long (an attribute name)");
      if (name.starts_with("goog") || name.starts_with(pubsub_internal::kBase64AttributePrefix))
        return refuse("starts with 'goog' (reserved by Pub/Sub) or 'idem-b64:' (idem's)");
      if (pubsub_internal::NeedsBase64(name)) return refuse("is not printable UTF-8 (attribute names are text)");
      if (value.size() > 700) return refuse("has a value longer than 700 bytes (an attribute value, base64 included)");
      if (!SetAttribute(attrs, name, value))
        return refuse("is given twice, or is a name idem uses (attributes are a map: one value per name)");
    }
    if (ordering.empty()) ordering = o_.ordering_key;
    nlohmann::json msg = {{"attributes", std::move(attrs)}};
    if (!m.payload.empty()) msg["data"] = http_internal::Base64Encode(m.payload);
    if (!ordering.empty()) msg["orderingKey"] = ordering;
    return msg;
  }

  Status Send(const std::string& path, const std::string& topic, const nlohmann::json& body, size_t n) {
    const std::string what = "Pub/Sub publish to topic '" + topic + "' at " + client_->endpoint();
    auto r = client_->Call("POST", path, &body);
    if (!r.ok()) return r.status();
    if (r->error) {
      Status s = pubsub_internal::ToStatus(*r->error, what);
      // No such topic: the service refuses it (PublisherTraits: kRejected).
      if (s.code() == Code::kNotFound) return Status::Rejected(s.message());
      return s;
    }
    auto ids = r->body.find("messageIds");
    if (ids == r->body.end() || !ids->is_array() || ids->size() != n)
      return Status::InDoubt(what + ": the answer does not list " + std::to_string(n) + " message ids");
    return Status::OK();
  }

  Options o_;
  std::unique_ptr<RestClient> client_;
};

}  // namespace

Result<std::unique_ptr<Publisher>> Publisher::Open(const Options& options) {
  Options o = options;
  IDEM_RETURN_IF_ERROR(options_internal::NotEmpty(kWhat, "id_attribute", o.id_attribute));
  IDEM_RETURN_IF_ERROR(options_internal::InRange(kWhat, "max_batch", o.max_batch, 1, 1'000));
  if (o.env == nullptr) o.env = Env::Default();
  IDEM_ASSIGN_OR_RETURN(auto client, pubsub_internal::OpenClient(o.connection, o.env));
  auto p = std::make_unique<PublisherImpl>(std::move(o), std::move(client));
  IDEM_RETURN_IF_ERROR(p->Init());
  return std::unique_ptr<Publisher>(std::move(p));
}

Result<Publisher::Options> Publisher::ParseUrl(std::string_view url) {
  Options o;
  std::string sub;
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, pubsub_internal::ParseConnectionUrl(url, o.connection, &sub));
  IDEM_RETURN_IF_ERROR(
      u.CheckKeys({IDEM_PUBSUB_CONNECTION_KEYS, IDEM_PUBSUB_SOURCE_KEYS, "ordering_key", "max_batch"}));
  o.topic = u.Get("topic");
  o.id_attribute = u.Get("id_attribute", o.id_attribute);
  o.ordering_key = u.Get("ordering_key");
  IDEM_ASSIGN_OR_RETURN(o.create, u.GetBool("create", o.create));
  IDEM_ASSIGN_OR_RETURN(int64_t max_batch, u.GetInt("max_batch", o.max_batch, 1, 1'000));
  o.max_batch = static_cast<int>(max_batch);
  return o;
}

}  // namespace idem::pubsub
