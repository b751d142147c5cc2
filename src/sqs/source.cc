// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::sqs::Source: ReceiveMessage (long polling), DeleteMessage[Batch],
// ChangeMessageVisibility over the SQS JSON protocol (src/sqs/common.h).
#include "idem/sqs/source.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/options_check.h"
#include "sqs/common.h"

namespace idem::sqs {
namespace {

using nlohmann::json;
using sqs_internal::Call;

// Single Acks sent at once; more wait and go together (DeleteMessageBatch).
constexpr int kAckSenders = 4;

class SourceImpl final : public Source {
 public:
  SourceImpl(Options o, sqs_internal::Connection c)
      : o_(std::move(o)),
        client_(std::move(c.client)),
        queue_(std::move(c.queue)),
        env_(o_.connect.env != nullptr ? o_.connect.env : Env::Default()),
        lease_s_(o_.lease_ms / 1000) {}

  const std::string& queue_url() const override { return queue_.url; }
  bool fifo() const override { return queue_.fifo; }
  int64_t retention_period_ms() const override { return queue_.retention_ms; }
  int64_t lease_ms() const override { return lease_s_ * 1000; }

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    if (max < 1) return Status::InvalidArgument("SQS Receive: max must be at least 1");
    const int64_t deadline = env_->NowMs() + std::max<int64_t>(wait_ms, 0);
    json input = {{"QueueUrl", queue_.url},
                  {"MaxNumberOfMessages", std::min(max, sqs_internal::kMaxBatch)},
                  {"VisibilityTimeout", lease_s_},
                  {"MessageAttributeNames", {"All"}},
                  {"AttributeNames", {"ApproximateReceiveCount"}},
                  {"MessageSystemAttributeNames", {"ApproximateReceiveCount"}}};
    for (;;) {
      const int64_t left = deadline - env_->NowMs();
      const int64_t wait_s = left <= 0 ? 0 : sqs_internal::Seconds(left, sqs_internal::kMaxWaitSeconds);
      input["WaitTimeSeconds"] = wait_s;
      IDEM_ASSIGN_OR_RETURN(json got,
                            Call(*client_, "ReceiveMessage", input, Where("ReceiveMessage"), false, wait_s * 1000));
      std::vector<Delivery> out;
      if (got.contains("Messages") && got["Messages"].is_array()) {
        out.reserve(got["Messages"].size());
        for (const json& m : got["Messages"]) {
          Delivery d;
          d.message = sqs_internal::DecodeMessage(m, o_.id_attribute, o_.message_id_fallback);
          d.receipt = m.value("ReceiptHandle", std::string());
          if (d.receipt.empty())
            return Status::Internal(Where("ReceiveMessage") + ": a message without a receipt handle");
          out.push_back(std::move(d));
        }
      }
      if (!out.empty() || env_->NowMs() >= deadline) return out;
    }
  }

  Status Ack(const Delivery& d) override {
    Pending me{.receipt = &d.receipt};
    std::unique_lock<std::mutex> l(ack_mu_);
    acks_.push_back(&me);
    while (!me.done) {
      if (ack_senders_ >= kAckSenders || acks_.empty()) {
        ack_cv_.wait(l);  // for a sender to finish (maybe with this ack)
        continue;
      }
      // This thread sends the first 10 waiting (itself among them, or the
      // acks of threads that came first). While kAckSenders calls are out,
      // later acks wait and go together: one call carries up to 10.
      ++ack_senders_;
      const size_t n = std::min<size_t>(acks_.size(), sqs_internal::kMaxBatch);
      std::vector<Pending*> batch(acks_.begin(), acks_.begin() + static_cast<std::ptrdiff_t>(n));
      acks_.erase(acks_.begin(), acks_.begin() + static_cast<std::ptrdiff_t>(n));
      l.unlock();
      Delete(batch);
      l.lock();
      for (Pending* p : batch) p->done = true;
      --ack_senders_;
      ack_cv_.notify_all();
    }
    if (!me.status.ok()) return me.status.WithContext("ack of " + Printable(d.message.id));
    return Status::OK();
  }

  // DeleteMessageBatch calls of up to 10, in turn.
  std::vector<Status> AckBatch(std::span<const Delivery> deliveries) override {
    std::vector<Status> out;
    out.reserve(deliveries.size());
    for (size_t from = 0; from < deliveries.size(); from += sqs_internal::kMaxBatch) {
      const size_t n = std::min<size_t>(sqs_internal::kMaxBatch, deliveries.size() - from);
      std::vector<Pending> chunk(n);
      std::vector<Pending*> batch;
      for (size_t i = 0; i < n; ++i) {
        chunk[i].receipt = &deliveries[from + i].receipt;
        batch.push_back(&chunk[i]);
      }
      Delete(batch);
      for (size_t i = 0; i < n; ++i) {
        const Delivery& d = deliveries[from + i];
        out.push_back(chunk[i].status.ok() ? Status::OK()
                                           : chunk[i].status.WithContext("ack of " + Printable(d.message.id)));
      }
    }
    return out;
  }

  Status Nack(const Delivery& d, int64_t delay_ms) override {
    return ChangeVisibility(d, sqs_internal::Seconds(delay_ms, sqs_internal::kMaxVisibilitySeconds), "nack");
  }

  Status ExtendLease(const Delivery& d) override { return ChangeVisibility(d, lease_s_, "lease extension"); }

 private:
  struct Pending {
    const std::string* receipt = nullptr;
    Status status;
    bool done = false;
  };

  std::string Where(std::string_view op) const {
    return "SQS " + std::string(op) + " on queue '" + queue_.name + "' at " + client_->endpoint();
  }

  Status ChangeVisibility(const Delivery& d, int64_t seconds, std::string_view verb) {
    auto r = Call(*client_, "ChangeMessageVisibility",
                  {{"QueueUrl", queue_.url}, {"ReceiptHandle", d.receipt}, {"VisibilityTimeout", seconds}},
                  Where("ChangeMessageVisibility"), /*receipt_call=*/true);
    if (!r.ok()) return r.status().WithContext(std::string(verb) + " of " + Printable(d.message.id));
    return Status::OK();
  }

  // DeleteMessage for one, DeleteMessageBatch for more; each gets its status.
  void Delete(const std::vector<Pending*>& batch) {
    if (batch.size() == 1) {
      auto r = Call(*client_, "DeleteMessage", {{"QueueUrl", queue_.url}, {"ReceiptHandle", *batch[0]->receipt}},
                    Where("DeleteMessage"), /*receipt_call=*/true);
      batch[0]->status = r.status();
      return;
    }
    json entries = json::array();
    for (size_t i = 0; i < batch.size(); ++i)
      entries.push_back({{"Id", std::to_string(i)}, {"ReceiptHandle", *batch[i]->receipt}});
    auto r = Call(*client_, "DeleteMessageBatch", {{"QueueUrl", queue_.url}, {"Entries", std::move(entries)}},
                  Where("DeleteMessageBatch"), /*receipt_call=*/true);
    if (!r.ok()) {
      for (Pending* p : batch) p->status = r.status();
      return;
    }
    const std::string what = Where("DeleteMessageBatch");
    std::vector<Status> st = sqs_internal::BatchStatuses(
        *r, batch.size(), what,
        [&](const aws_internal::ServiceError& e) { return sqs_internal::ErrorStatus(e, what, true); });
    for (size_t i = 0; i < batch.size(); ++i) batch[i]->status = std::move(st[i]);
  }

  const Options o_;
  std::unique_ptr<aws_internal::JsonClient> client_;
  const sqs_internal::Queue queue_;
  Env* env_;
  const int64_t lease_s_;
  std::mutex ack_mu_;
  std::condition_variable ack_cv_;
  std::vector<Pending*> acks_;
  int ack_senders_ = 0;  // Ack calls out now, at most kAckSenders
};

}  // namespace

Result<std::unique_ptr<Source>> Source::Open(const Options& options) {
  constexpr std::string_view kWhat = "SQS source";
  IDEM_RETURN_IF_ERROR(options_internal::NotEmpty(kWhat, "queue", options.queue));
  IDEM_RETURN_IF_ERROR(options_internal::NotEmpty(kWhat, "id_attribute", options.id_attribute));
  IDEM_RETURN_IF_ERROR(options_internal::InRange(kWhat, "lease_ms", options.lease_ms, 1'000,
                                                 sqs_internal::kMaxVisibilitySeconds * 1000));
  if (options.lease_ms % 1000 != 0)
    return Status::InvalidArgument("SQS source: lease_ms must be whole seconds (SQS's visibility timeout), got " +
                                   std::to_string(options.lease_ms));
  IDEM_ASSIGN_OR_RETURN(sqs_internal::Connection c,
                        sqs_internal::Connect(kWhat, options.connect, options.queue, options.create_queue));
  return std::unique_ptr<Source>(std::make_unique<SourceImpl>(options, std::move(c)));
}

Result<Source::Options> Source::ParseUrl(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(sqs_internal::UrlParts p, sqs_internal::ParseSqsUrl(url));
  Options o;
  o.queue = std::move(p.queue);
  if (o.queue.empty())
    return Status::InvalidArgument("an SQS URL needs a queue: sqs://QUEUE or sqs://?queue_url=URL, got '" +
                                   RedactUrl(url) + "'");
  o.connect = std::move(p.connect);
  o.create_queue = p.create_queue;
  o.id_attribute = p.url.Get("id_attribute", o.id_attribute);
  IDEM_ASSIGN_OR_RETURN(o.message_id_fallback, p.url.GetBool("message_id_fallback", o.message_id_fallback));
  IDEM_ASSIGN_OR_RETURN(o.lease_ms,
                        p.url.GetInt("lease_ms", o.lease_ms, 1'000, sqs_internal::kMaxVisibilitySeconds * 1000));
  IDEM_RETURN_IF_ERROR(p.url.GetBool("deduplicate_by_id", true).status());
  return o;
}

}  // namespace idem::sqs
