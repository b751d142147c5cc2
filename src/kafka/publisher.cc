// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// kafka::Publisher: an idempotent producer (acks=all) writing the wire format
// of doc/wire-format.md, one flush per batch.
#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <mutex>

#include "core/options_check.h"
#include "core/publish_batch.h"
#include "idem/kafka/publisher.h"
#include "kafka/conn.h"
#include "kafka/errors.h"

namespace idem::kafka {

using kafka_internal::CheckBrokers;
using kafka_internal::ConfPtr;
using kafka_internal::HeadersPtr;
using kafka_internal::RkPtr;
using kafka_internal::Set;
using kafka_internal::Translate;

struct Publisher::Impl {
  Options o;
  RkPtr rk;
  bool idempotent = false;  // enable.idempotence as the producer was created with
  std::mutex mu;
  Status first_error;  // since the last Flush

  // What one PublishBatch collects from its delivery reports. Shared with
  // each record's opaque (a Slot), so that a report that comes after the
  // batch gave up on it still has somewhere to go.
  struct Reports {
    std::mutex mu;
    std::vector<Status> status;
    std::vector<bool> done;
  };
  struct Slot {
    std::shared_ptr<Reports> reports;
    size_t index;
  };

  static void DeliveryCb(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
    auto* self = static_cast<Impl*>(opaque);
    if (m->_private != nullptr) {  // a PublishBatch record
      std::unique_ptr<Slot> slot(static_cast<Slot*>(m->_private));
      const std::string topic = m->rkt != nullptr ? rd_kafka_topic_name(m->rkt) : std::string();
      std::lock_guard<std::mutex> l(slot->reports->mu);
      slot->reports->status[slot->index] = Translate(m->err, "delivering a record to " + topic);
      slot->reports->done[slot->index] = true;
      return;
    }
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) return;
    std::lock_guard<std::mutex> l(self->mu);
    if (self->first_error.ok()) self->first_error = Translate(m->err, "delivering a record to " + self->o.topic);
  }

  // Queues one record of `message` on `topic` (the headers: the id's, the
  // message's, the ordering key's when not empty, the producer time's).
  Status Produce(const std::string& topic, const Message& message, int32_t partition, std::string_view key,
                 std::string_view ordering_key, void* opaque) {
    IDEM_RETURN_IF_ERROR(ValidateId(message.id));
    HeadersPtr hdrs(rd_kafka_headers_new(message.headers.size() + 3));
    auto add = [&](std::string_view name, std::string_view value) {
      rd_kafka_header_add(hdrs.get(), name.data(), static_cast<ssize_t>(name.size()), value.data(),
                          static_cast<ssize_t>(value.size()));
    };
    add(o.id_header, message.id);
    for (const auto& [name, value] : message.headers) add(name, value);
    if (!ordering_key.empty()) add(kOrderingKeyHeader, ordering_key);
    if (message.producer_time_ms) add(kProducerTimeHeader, std::to_string(*message.producer_time_ms));
    rd_kafka_resp_err_t err =
        rd_kafka_producev(rk.get(), RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(partition),
                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                          RD_KAFKA_V_VALUE(const_cast<char*>(message.payload.data()), message.payload.size()),
                          RD_KAFKA_V_KEY(key.data(), key.size()), RD_KAFKA_V_HEADERS(hdrs.get()),
                          RD_KAFKA_V_OPAQUE(opaque), RD_KAFKA_V_END);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) (void)hdrs.release();  // owned by the record now
    rd_kafka_poll(rk.get(), 0);                                   // serve delivery reports
    return Translate(err, "producing " + message.id + " to " + topic);
  }
};

Publisher::Publisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Publisher::~Publisher() {
  if (impl_ && impl_->rk) (void)rd_kafka_flush(impl_->rk.get(), 10'000);
}

Result<std::unique_ptr<Publisher>> Publisher::Open(const Options& options) {
  constexpr std::string_view kWhat = "kafka publisher";
  IDEM_RETURN_IF_ERROR(options_internal::NotEmpty(kWhat, "brokers", options.brokers));
  IDEM_RETURN_IF_ERROR(options_internal::NotEmpty(kWhat, "id_header", options.id_header));
  IDEM_RETURN_IF_ERROR(options_internal::AtLeast(kWhat, "connect_timeout_ms", options.connect_timeout_ms, 0));
  IDEM_RETURN_IF_ERROR(
      options_internal::InRange(kWhat, "publish_timeout_ms", options.publish_timeout_ms, 1, INT32_MAX));
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  ConfPtr conf(rd_kafka_conf_new());
  IDEM_RETURN_IF_ERROR(Set(conf.get(), "bootstrap.servers", impl->o.brokers));
  IDEM_RETURN_IF_ERROR(Set(conf.get(), "acks", impl->o.acks));
  // Idempotent (no duplicates, no reordering on the producer's retries)
  // where acks=all allows it; one key always in one partition, as Java
  // clients place it.
  if (impl->o.acks == "all" || impl->o.acks == "-1")
    IDEM_RETURN_IF_ERROR(Set(conf.get(), "enable.idempotence", "true"));
  IDEM_RETURN_IF_ERROR(Set(conf.get(), "partitioner", "murmur2_random"));
  for (const auto& [k, v] : impl->o.config) IDEM_RETURN_IF_ERROR(Set(conf.get(), k, v));
  {
    char value[16];
    size_t n = sizeof value;
    impl->idempotent = rd_kafka_conf_get(conf.get(), "enable.idempotence", value, &n) == RD_KAFKA_CONF_OK &&
                       std::string_view(value) == "true";
  }
  rd_kafka_conf_set_dr_msg_cb(conf.get(), &Impl::DeliveryCb);
  rd_kafka_conf_set_opaque(conf.get(), impl.get());
  char errstr[512];
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr, sizeof errstr);
  if (rk == nullptr) return Status::InvalidArgument(std::string("kafka: creating the producer: ") + errstr);
  (void)conf.release();
  impl->rk.reset(rk);
  if (impl->o.connect_timeout_ms > 0)
    IDEM_RETURN_IF_ERROR(CheckBrokers(rk, impl->o.brokers, impl->o.connect_timeout_ms));
  return std::unique_ptr<Publisher>(new Publisher(std::move(impl)));
}

Status Publisher::Produce(const Message& message, const ProduceOptions& options) {
  Impl& s = *impl_;
  if (s.o.topic.empty()) return publish_internal::NoChannel("kafka", "topic");
  const std::string& key = options.key ? *options.key : message.id;
  return s.Produce(s.o.topic, message, options.partition, key, {}, nullptr);
}

std::vector<Status> Publisher::PublishBatch(std::span<const Outgoing> batch) {
  Impl& s = *impl_;
  auto reports = std::make_shared<Impl::Reports>();
  reports->status.assign(batch.size(), Status::OK());
  reports->done.assign(batch.size(), true);
  size_t produced = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    auto d = publish_internal::Destination(batch[i], s.o.topic, "kafka", "topic");
    if (!d.ok()) {
      reports->status[i] = d.status();
      continue;
    }
    const Message& m = *batch[i].message;
    const std::string topic(*d);
    const std::string_view key = batch[i].key.empty() ? std::string_view(m.id) : batch[i].key;
    {
      std::lock_guard<std::mutex> l(reports->mu);
      reports->done[i] = false;
    }
    auto slot = std::make_unique<Impl::Slot>(Impl::Slot{reports, i});
    Status p = s.Produce(topic, m, -1, key, batch[i].key, slot.get());
    if (p.ok()) {
      (void)slot.release();  // the delivery report frees it
      ++produced;
      continue;
    }
    std::lock_guard<std::mutex> l(reports->mu);
    reports->status[i] = p;
    reports->done[i] = true;
  }
  if (produced > 0) {
    // Waits for every record of this producer, this batch's among them.
    (void)rd_kafka_flush(s.rk.get(), static_cast<int>(std::clamp<int64_t>(s.o.publish_timeout_ms, 0, INT32_MAX)));
  }
  std::lock_guard<std::mutex> l(reports->mu);
  for (size_t i = 0; i < batch.size(); ++i)
    if (!reports->done[i])
      reports->status[i] = Status::InDoubt("kafka: no delivery report within " +
                                           std::to_string(s.o.publish_timeout_ms) + " ms: publish again");
  return std::move(reports->status);
}

PublisherTraits Publisher::traits() const { return {.ordered_batch = impl_->idempotent, .max_batch = 1000}; }

std::string_view Publisher::Channel() const { return impl_->o.topic; }

Status Publisher::Flush(int64_t timeout_ms) {
  Impl& s = *impl_;
  rd_kafka_resp_err_t err = rd_kafka_flush(s.rk.get(), static_cast<int>(std::clamp<int64_t>(timeout_ms, 0, INT32_MAX)));
  std::lock_guard<std::mutex> l(s.mu);
  Status first = std::move(s.first_error);
  s.first_error = Status::OK();
  if (!first.ok()) return first;
  return Translate(err, "flushing the producer of " + s.o.topic);
}

Status Publisher::Publish(const Message& message) {
  IDEM_RETURN_IF_ERROR(Produce(message));
  return Flush(impl_->o.publish_timeout_ms);
}

}  // namespace idem::kafka
