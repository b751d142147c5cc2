// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::sqs::Publisher: SendMessage and SendMessageBatch over the SQS JSON
// protocol (src/sqs/common.h).
#include "idem/sqs/publisher.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/options_check.h"
#include "core/publish_batch.h"
#include "sqs/common.h"

namespace idem::sqs {
namespace {

using nlohmann::json;
using sqs_internal::Call;

class PublisherImpl final : public Publisher {
 public:
  PublisherImpl(Options o, sqs_internal::Connection c)
      : o_(std::move(o)), client_(std::move(c.client)), own_(std::move(c.queue)) {}

  Status Publish(const Message& m) override {
    if (own_.url.empty()) return publish_internal::NoChannel("SQS", "queue");
    IDEM_ASSIGN_OR_RETURN(json entry, Encode(m, own_, {}));
    entry["QueueUrl"] = own_.url;
    auto r = Call(*client_, "SendMessage", entry, Where(own_, "SendMessage"));
    if (!r.ok()) return Refusal(r.status()).WithContext("publish of " + Printable(m.id));
    return Status::OK();
  }

  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override {
    std::vector<Status> out(batch.size(), Status::OK());
    // Elements by destination, in order, then calls of up to 10.
    std::map<std::string, std::vector<size_t>> by_queue;
    std::vector<std::string> order;
    for (size_t i = 0; i < batch.size(); ++i) {
      auto d = publish_internal::Destination(batch[i], o_.queue, "SQS", "queue");
      if (!d.ok()) {
        out[i] = d.status();
        continue;
      }
      const std::string dest(*d);
      auto [it, fresh] = by_queue.try_emplace(dest);
      if (fresh) order.push_back(dest);
      it->second.push_back(i);
    }
    for (const std::string& dest : order) {
      const std::vector<size_t>& idx = by_queue[dest];
      auto q = QueueOf(dest);
      if (!q.ok()) {
        for (size_t i : idx) out[i] = Refusal(q.status());
        continue;
      }
      for (size_t from = 0; from < idx.size(); from += sqs_internal::kMaxBatch) {
        const size_t to = std::min(idx.size(), from + sqs_internal::kMaxBatch);
        SendBatch(*q, batch, std::span<const size_t>(idx).subspan(from, to - from), out);
      }
    }
    return out;
  }

  PublisherTraits traits() const override { return {.ordered_batch = false, .max_batch = 1000}; }
  std::string_view Channel() const override { return o_.queue; }

 private:
  std::string Where(const sqs_internal::Queue& q, std::string_view op) const {
    return "SQS " + std::string(op) + " to queue '" + q.name + "' at " + client_->endpoint();
  }

  Result<json> Encode(const Message& m, const sqs_internal::Queue& q, std::string_view key) const {
    return sqs_internal::EncodeMessage(m, {.id_attribute = o_.id_attribute,
                                           .fifo = q.fifo,
                                           .deduplicate_by_id = o_.deduplicate_by_id,
                                           .key = key,
                                           .group_id = o_.group_id});
  }

  // A queue SQS says does not exist is a refusal that sending again does
  // not mend.
  static Status Refusal(const Status& s) {
    if (s.code() == Code::kNotFound) return Status::Rejected(s.message());
    return s;
  }

  Result<sqs_internal::Queue> QueueOf(const std::string& dest) {
    if (dest == o_.queue && !own_.url.empty()) return own_;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (auto it = known_.find(dest); it != known_.end()) return it->second;
    }
    IDEM_ASSIGN_OR_RETURN(sqs_internal::Queue q, sqs_internal::LookUp(*client_, dest));
    std::lock_guard<std::mutex> l(mu_);
    known_.emplace(dest, q);
    return q;
  }

  void SendBatch(const sqs_internal::Queue& q, std::span<const Outgoing> batch, std::span<const size_t> idx,
                 std::vector<Status>& out) {
    json entries = json::array();
    std::vector<size_t> sent;  // entry k answers batch[sent[k]]
    for (size_t i : idx) {
      Message m = *batch[i].message;
      m.headers = publish_internal::HeadersWithKey(m, batch[i].key);
      auto e = Encode(m, q, batch[i].key);
      if (!e.ok()) {
        out[i] = e.status();
        continue;
      }
      (*e)["Id"] = std::to_string(sent.size());
      entries.push_back(std::move(*e));
      sent.push_back(i);
    }
    if (sent.empty()) return;
    auto r = Call(*client_, "SendMessageBatch", {{"QueueUrl", q.url}, {"Entries", std::move(entries)}},
                  Where(q, "SendMessageBatch"));
    if (!r.ok()) {
      for (size_t i : sent) out[i] = Refusal(r.status());
      return;
    }
    const std::string what = Where(q, "SendMessageBatch");
    std::vector<Status> st =
        sqs_internal::BatchStatuses(*r, sent.size(), what, [&](const aws_internal::ServiceError& e) {
          const std::string said = e.type + ": " + e.message;
          return e.http_status < 500 ? Status::Rejected(what + " refused the message (" + said + ")")
                                     : Status::Unavailable(what + " failed the message (" + said + ")");
        });
    for (size_t k = 0; k < sent.size(); ++k) out[sent[k]] = std::move(st[k]);
  }

  const Options o_;
  std::unique_ptr<aws_internal::JsonClient> client_;
  const sqs_internal::Queue own_;
  std::mutex mu_;
  std::map<std::string, sqs_internal::Queue> known_;
};

}  // namespace

Result<std::unique_ptr<Publisher>> Publisher::Open(const Options& options) {
  constexpr std::string_view kWhat = "SQS publisher";
  IDEM_RETURN_IF_ERROR(options_internal::NotEmpty(kWhat, "id_attribute", options.id_attribute));
  IDEM_ASSIGN_OR_RETURN(sqs_internal::Connection c,
                        sqs_internal::Connect(kWhat, options.connect, options.queue, options.create_queue));
  return std::unique_ptr<Publisher>(std::make_unique<PublisherImpl>(options, std::move(c)));
}

Result<Publisher::Options> Publisher::ParseUrl(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(sqs_internal::UrlParts p, sqs_internal::ParseSqsUrl(url));
  Options o;
  o.queue = std::move(p.queue);
  o.connect = std::move(p.connect);
  o.create_queue = p.create_queue;
  o.id_attribute = p.url.Get("id_attribute", o.id_attribute);
  o.group_id = p.url.Get("group_id");
  IDEM_ASSIGN_OR_RETURN(o.deduplicate_by_id, p.url.GetBool("deduplicate_by_id", o.deduplicate_by_id));
  IDEM_RETURN_IF_ERROR(p.url.GetBool("message_id_fallback", true).status());
  IDEM_RETURN_IF_ERROR(p.url.GetInt("lease_ms", 30'000, 1'000, sqs_internal::kMaxVisibilitySeconds * 1000).status());
  return o;
}

}  // namespace idem::sqs
