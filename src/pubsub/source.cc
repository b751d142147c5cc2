// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::pubsub::Source: a pull subscription as a Source (the mapping is in
// include/idem/pubsub/source.h); the REST calls are src/pubsub/rest.h's.
#include "idem/pubsub/source.h"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "core/json_string.h"
#include "core/options_check.h"
#include "core/wire_format.h"
#include "http/base64.h"
#include "idem/publisher.h"
#include "pubsub/common.h"
#include "pubsub/wire.h"

namespace idem::pubsub_internal {

bool NeedsBase64(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return true;
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t n = internal::Utf8Length(s, i);
    if (n == 0) return true;
    i += n;
  }
  return false;
}

Delivery DecodeReceived(const nlohmann::json& received, const DecodeSettings& s) {
  Delivery d;
  d.receipt = received.value("ackId", std::string());
  d.message.attempt = static_cast<int>(std::clamp<int64_t>(received.value("deliveryAttempt", int64_t{0}), 0, 1 << 30));
  static const nlohmann::json kEmpty = nlohmann::json::object();
  const nlohmann::json& m =
      received.contains("message") && received["message"].is_object() ? received["message"] : kEmpty;
  const std::string message_id = m.value("messageId", std::string());
  Message& out = d.message;
  std::string error;  // the first thing wrong with the message
  bool has_id = false;
  wire_internal::ProducerTimeReader time;
  if (auto a = m.find("attributes"); a != m.end() && a->is_object()) {
    for (const auto& [name, v] : a->items()) {
      if (!v.is_string()) continue;
      std::string k = name;
      std::string value = v.get<std::string>();
      if (k.starts_with(kBase64AttributePrefix)) {
        k.erase(0, kBase64AttributePrefix.size());
        auto bytes = value.empty() ? std::optional<std::string>("") : http_internal::Base64Decode(value);
        if (!bytes) {
          if (error.empty()) error = "Pub/Sub message " + message_id + ": attribute '" + name + "' is not base64";
          continue;
        }
        value = std::move(*bytes);
      }
      if (k == s.id_attribute) {
        out.id = value;
        has_id = true;
      } else if (!time.Offer(k, value)) {
        out.headers.emplace_back(k, value);
      }
    }
  }
  out.producer_time_ms = time.time();
  if (std::string key = m.value("orderingKey", std::string()); !key.empty())
    out.headers.emplace_back(std::string(kOrderingKeyHeader), std::move(key));
  if (!has_id && s.id_fallback && !message_id.empty()) {
    out.id = message_id;
    has_id = true;
  }
  const std::string where = "Pub/Sub message " + message_id + " of " + std::string(s.subscription);
  if (!error.empty()) {
    error += " (" + std::string(s.subscription) + ")";
  } else if (!has_id) {
    error = where + " has no attribute '" + std::string(s.id_attribute) + "' (the message id)";
  } else if (Status v = ValidateId(out.id); !v.ok()) {
    error = where + ": its id is not valid (" + v.message() + ")";
  }
  const std::string data = m.value("data", std::string());
  if (!data.empty()) {
    if (auto bytes = http_internal::Base64Decode(data)) {
      out.payload = std::move(*bytes);
    } else if (error.empty()) {
      error = where + ": its data is not base64";
    }
  }
  if (!error.empty()) {
    // The Consumer dead-letters a delivery with an invalid id at once.
    out.id.clear();
    out.headers.emplace_back(std::string(pubsub::kErrorHeader), std::move(error));
  }
  return d;
}

}  // namespace idem::pubsub_internal

namespace idem::pubsub {
namespace {

using pubsub_internal::RestClient;

constexpr std::string_view kWhat = "Pub/Sub source";

class SourceImpl final : public Source {
 public:
  SourceImpl(Options o, std::unique_ptr<RestClient> client)
      : o_(std::move(o)),
        client_(std::move(client)),
        name_(pubsub_internal::SubscriptionName(o_.connection.project, o_.subscription)),
        path_("/v1/" + name_) {}

  // Reads the subscription (creating it with `create`) and its deadline.
  Status Init() {
    auto sub = pubsub_internal::GetResource(*client_, name_, "subscription");
    if (!sub.ok() && sub.status().code() == Code::kNotFound && o_.create) {
      IDEM_RETURN_IF_ERROR(Create());
      sub = pubsub_internal::GetResource(*client_, name_, "subscription");
    }
    if (!sub.ok()) {
      if (sub.status().code() == Code::kNotFound)
        return Status::NotFound(sub.status().message() + " (create it, or open with create and a topic)");
      return sub.status();
    }
    const int64_t seconds = sub->value("ackDeadlineSeconds", int64_t{10});
    lease_seconds_ = std::clamp<int64_t>(seconds, 10, 600);
    exactly_once_ = sub->value("enableExactlyOnceDelivery", false);
    batch_acks_ = o_.batch_acks && !exactly_once_;
    return Status::OK();
  }

  ~SourceImpl() override { (void)Flush(); }

  bool exactly_once() const override { return exactly_once_; }

  Status Flush() override {
    std::vector<std::string> ids;
    {
      std::lock_guard l(mu_);
      ids.swap(pending_acks_);
    }
    Status out;
    for (size_t start = 0; start < ids.size(); start += 1000) {
      const size_t end = std::min(ids.size(), start + 1000);
      const nlohmann::json body = {
          {"ackIds", std::vector<std::string>(ids.begin() + static_cast<std::ptrdiff_t>(start),
                                              ids.begin() + static_cast<std::ptrdiff_t>(end))}};
      auto r = client_->Call("POST", path_ + ":acknowledge", &body);
      Status s = pubsub_internal::ReplyStatus(
          r, "Pub/Sub acknowledge of " + std::to_string(end - start) + " deliveries on " + Where());
      if (!s.ok() && out.ok()) out = s;
    }
    return out;
  }

  const std::string& name() const override { return name_; }
  int64_t lease_ms() const override { return lease_seconds_ * 1000; }

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    if (max < 1) return Status::InvalidArgument("Receive: max must be at least 1");
    Env* env = o_.env;
    const int64_t deadline = env->NowMs() + std::max<int64_t>(0, wait_ms);
    const nlohmann::json body = {{"maxMessages", std::min(max, 1000)}, {"returnImmediately", true}};
    const pubsub_internal::DecodeSettings settings{
        .subscription = name_, .id_attribute = o_.id_attribute, .id_fallback = o_.id_fallback};
    for (;;) {
      // The acks batched since the last call go first (see batch_acks).
      (void)Flush();
      auto r = client_->Call("POST", path_ + ":pull", &body);
      IDEM_RETURN_IF_ERROR(pubsub_internal::ReplyStatus(r, "Pub/Sub pull from " + Where()));
      std::vector<Delivery> out;
      if (auto it = r->body.find("receivedMessages"); it != r->body.end() && it->is_array()) {
        out.reserve(it->size());
        for (const nlohmann::json& rm : *it) {
          if (!rm.is_object()) continue;
          Delivery d = pubsub_internal::DecodeReceived(rm, settings);
          if (d.receipt.empty()) return Status::Internal("Pub/Sub pull from " + Where() + ": a message without ackId");
          out.push_back(std::move(d));
        }
      }
      if (!out.empty()) return out;
      const int64_t left = deadline - env->NowMs();
      if (left <= 0) return out;
      env->SleepMs(std::min(left, o_.poll_ms));
    }
  }

  Status Ack(const Delivery& d) override {
    if (d.receipt.empty()) return Status::InvalidArgument("Ack: the delivery has no receipt (ack id)");
    if (batch_acks_) {
      std::lock_guard l(mu_);
      pending_acks_.push_back(d.receipt);
      if (pending_acks_.size() < 1000) return Status::OK();
    }
    if (batch_acks_) return Flush();
    const nlohmann::json body = {{"ackIds", {d.receipt}}};
    return Settle(d, "ack", ":acknowledge", body);
  }

  Status Nack(const Delivery& d, int64_t delay_ms) override {
    const int64_t seconds = std::clamp<int64_t>((std::max<int64_t>(0, delay_ms) + 999) / 1000, 0, 600);
    return ModifyDeadline(d, "nack", seconds);
  }

  Status ExtendLease(const Delivery& d) override { return ModifyDeadline(d, "lease extension", lease_seconds_); }

 private:
  std::string Where() const { return "subscription '" + name_ + "' at " + client_->endpoint(); }

  Status Create() {
    if (o_.topic.empty())
      return Status::NotFound("Pub/Sub subscription '" + name_ + "' does not exist at " + client_->endpoint() +
                              ", and create needs the topic (topic=)");
    const std::string& project = o_.connection.project;
    IDEM_RETURN_IF_ERROR(pubsub_internal::CreateTopic(*client_, project, o_.topic));
    nlohmann::json body = {{"topic", pubsub_internal::TopicName(project, o_.topic)},
                           {"ackDeadlineSeconds", o_.lease_ms / 1000},
                           {"enableExactlyOnceDelivery", o_.exactly_once},
                           {"enableMessageOrdering", o_.ordering}};
    if (!o_.dead_letter_topic.empty()) {
      IDEM_RETURN_IF_ERROR(pubsub_internal::CreateTopic(*client_, project, o_.dead_letter_topic));
      body["deadLetterPolicy"] = {{"deadLetterTopic", pubsub_internal::TopicName(project, o_.dead_letter_topic)},
                                  {"maxDeliveryAttempts", o_.max_delivery_attempts}};
    }
    auto r = client_->Call("PUT", path_, &body);
    if (r.ok() && r->error && r->error->status == "ALREADY_EXISTS") return Status::OK();
    return pubsub_internal::ReplyStatus(r, "Pub/Sub create " + Where());
  }

  Status ModifyDeadline(const Delivery& d, std::string_view verb, int64_t seconds) {
    if (d.receipt.empty()) return Status::InvalidArgument(std::string(verb) + ": the delivery has no receipt (ack id)");
    const nlohmann::json body = {{"ackIds", {d.receipt}}, {"ackDeadlineSeconds", seconds}};
    return Settle(d, verb, ":modifyAckDeadline", body);
  }

  // One call about one ack id. The service refuses an ack id that is no
  // longer valid (expired and delivered again, or acked) with 400
  // INVALID_ARGUMENT (FAILED_PRECONDITION on some exactly-once answers):
  // the lease is lost.
  Status Settle(const Delivery& d, std::string_view verb, std::string_view op, const nlohmann::json& body) {
    auto r = client_->Call("POST", path_ + std::string(op), &body);
    if (!r.ok()) return r.status().WithContext(std::string(verb) + " of " + d.message.id + " on " + Where());
    if (!r->error) return Status::OK();
    const pubsub_internal::RestError& e = *r->error;
    if (e.http_status == 400 && (e.status == "INVALID_ARGUMENT" || e.status == "FAILED_PRECONDITION"))
      return Status::LeaseLost(std::string(verb) + " of " + d.message.id + " on " + Where() +
                               ": the service refused its ack id (expired and delivered again, or acked already: " +
                               e.status + (e.message.empty() ? "" : ", " + e.message) + ")");
    return pubsub_internal::ToStatus(e, "Pub/Sub " + std::string(verb) + " of " + d.message.id + " on " + Where());
  }

  Options o_;
  std::unique_ptr<RestClient> client_;
  const std::string name_;
  const std::string path_;
  int64_t lease_seconds_ = 10;
  bool exactly_once_ = false;
  bool batch_acks_ = false;
  std::mutex mu_;
  std::vector<std::string> pending_acks_;  // guarded by mu_
};

}  // namespace

Result<std::unique_ptr<Source>> Source::Open(const Options& options) {
  using options_internal::AtLeast;
  using options_internal::InRange;
  Options o = options;
  IDEM_RETURN_IF_ERROR(options_internal::NotEmpty(kWhat, "subscription", o.subscription));
  IDEM_RETURN_IF_ERROR(pubsub_internal::CheckResourceId("subscription", o.subscription));
  IDEM_RETURN_IF_ERROR(options_internal::NotEmpty(kWhat, "id_attribute", o.id_attribute));
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "poll_ms", o.poll_ms, 1));
  IDEM_RETURN_IF_ERROR(InRange(kWhat, "lease_ms", o.lease_ms, 10'000, 600'000));
  IDEM_RETURN_IF_ERROR(InRange(kWhat, "max_delivery_attempts", o.max_delivery_attempts, 5, 100));
  if (o.env == nullptr) o.env = Env::Default();
  IDEM_ASSIGN_OR_RETURN(auto client, pubsub_internal::OpenClient(o.connection, o.env));
  auto src = std::make_unique<SourceImpl>(std::move(o), std::move(client));
  IDEM_RETURN_IF_ERROR(src->Init());
  return std::unique_ptr<Source>(std::move(src));
}

Result<Source::Options> Source::ParseUrl(std::string_view url) {
  Options o;
  std::string sub;
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, pubsub_internal::ParseConnectionUrl(url, o.connection, &sub));
  IDEM_RETURN_IF_ERROR(
      u.CheckKeys({IDEM_PUBSUB_CONNECTION_KEYS, IDEM_PUBSUB_SOURCE_KEYS, "ordering_key", "max_batch"}));
  if (sub.empty())
    return Status::InvalidArgument("a Pub/Sub source URL names its subscription: pubsub://PROJECT/SUBSCRIPTION ('" +
                                   RedactUrl(url) + "')");
  o.subscription = sub;
  o.topic = u.Get("topic");
  o.id_attribute = u.Get("id_attribute", o.id_attribute);
  IDEM_ASSIGN_OR_RETURN(o.id_fallback, u.GetBool("id_fallback", o.id_fallback));
  IDEM_ASSIGN_OR_RETURN(o.poll_ms, u.GetInt("poll_ms", o.poll_ms, 1, 600'000));
  IDEM_ASSIGN_OR_RETURN(o.batch_acks, u.GetBool("batch_acks", o.batch_acks));
  IDEM_ASSIGN_OR_RETURN(o.create, u.GetBool("create", o.create));
  IDEM_ASSIGN_OR_RETURN(o.lease_ms, u.GetInt("lease_ms", o.lease_ms, 10'000, 600'000));
  IDEM_ASSIGN_OR_RETURN(o.exactly_once, u.GetBool("exactly_once", o.exactly_once));
  IDEM_ASSIGN_OR_RETURN(o.ordering, u.GetBool("ordering", o.ordering));
  o.dead_letter_topic = u.Get("dead_letter_topic");
  IDEM_ASSIGN_OR_RETURN(int64_t attempts, u.GetInt("max_delivery_attempts", o.max_delivery_attempts, 5, 100));
  o.max_delivery_attempts = static_cast<int>(attempts);
  return o;
}

}  // namespace idem::pubsub
