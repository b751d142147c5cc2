// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The delivery suite (util/delivery_suite.h, delivery_suite_test.cc) on
// idem::kafka::Source, on librdkafka's mock cluster: one cluster per test
// (3 brokers, a topic of 4 partitions), started by the fixture. Every handle
// of a test is a member of one consumer group on that topic.
//
// Kafka promises none of the suite's capabilities (doc/sources.md has the
// table): no lease, no delivery count (attempt 0), a nack seeks the partition
// back, an ack commits an offset prefix (a second one is OK), librdkafka does
// not survive fork(), and a record carries the id and producer time as
// headers too. Every other case runs.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/kafka/source.h"
#include "mock_kafka.h"
#include "util/delivery_suite.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

constexpr char kTopic[] = "suite";
constexpr char kGroup[] = "suite";
constexpr int kPartitions = 4;

// A kafka::Source fetches records in the background, and joins its group
// first (which takes a moment on the mock cluster). The suite's Receive(max,
// 0) means "whatever is visible now"; here that is, once the group assigned
// this member its partitions (at most 60 s), whatever arrives until no record
// came for 1 s of real time (at most 20 s; a loaded machine can hold a fetch
// back for hundreds of ms), as amqp_delivery_suite_test.cc does for RabbitMQ. max < 1 goes to the source unchanged
// (kInvalidArgument).
class Fetched final : public Source {
 public:
  explicit Fetched(std::unique_ptr<kafka::Source> inner) : inner_(std::move(inner)) {}

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    if (max < 1) return inner_->Receive(max, wait_ms);
    using Clock = std::chrono::steady_clock;
    std::vector<Delivery> out;
    auto more = [&](int64_t wait) -> Status {
      auto got = inner_->Receive(max - static_cast<int>(out.size()), wait);
      if (!got.ok()) return got.status();
      for (Delivery& d : *got) out.push_back(std::move(d));
      return Status::OK();
    };
    const auto join_deadline = Clock::now() + std::chrono::seconds(60);
    while (inner_->Assignment().empty() && static_cast<int>(out.size()) < max && Clock::now() < join_deadline)
      IDEM_RETURN_IF_ERROR(more(50));
    if (static_cast<int>(out.size()) < max) IDEM_RETURN_IF_ERROR(more(wait_ms));
    const auto hard = Clock::now() + std::chrono::seconds(20);
    constexpr auto kQuiet = std::chrono::milliseconds(1000);
    auto quiet_until = Clock::now() + kQuiet;
    while (static_cast<int>(out.size()) < max && Clock::now() < quiet_until && Clock::now() < hard) {
      const size_t before = out.size();
      IDEM_RETURN_IF_ERROR(more(20));
      if (out.size() != before) quiet_until = Clock::now() + kQuiet;
    }
    return out;
  }
  Status Ack(const Delivery& d) override { return inner_->Ack(d); }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_->Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_->Kind(); }
  int64_t lease_ms() const override { return inner_->lease_ms(); }
  Status ExtendLease(const Delivery& d) override { return inner_->ExtendLease(d); }

 private:
  std::unique_ptr<kafka::Source> inner_;
};

Result<std::shared_ptr<void>> StartCluster(const TempDir&) {
  auto cluster = std::make_shared<MockKafka>(kTopic, kPartitions, kGroup);
  if (!cluster->ok()) return Status::Unavailable("kafka mock cluster: " + cluster->error());
  return std::shared_ptr<void>(std::move(cluster));
}

// Short timers: the mock cluster answers at once. A rebalance waits for the
// members it knows to rejoin for at most max.poll.interval.ms (5 min by
// default): a member whose LeaveGroup a loaded machine delayed would hold the
// next member's assignment back past the suite's 60 s; 20 s bounds it.
Result<SourceHandle> OpenKafka(const TempDir&, const SourceConfig& c) {
  auto* cluster = static_cast<MockKafka*>(c.broker.get());
  if (cluster == nullptr) return Status::InvalidArgument("kafka: the suite's mock cluster was not started");
  // The second channel: a topic of its own, read by a group of its own.
  const std::string topic = std::string(kTopic) + (c.other_channel ? "-other" : "");
  const std::string group = std::string(kGroup) + (c.other_channel ? "-other" : "");
  if (c.other_channel) (void)rd_kafka_mock_topic_create(cluster->cluster(), topic.c_str(), kPartitions, 1);
  auto s = kafka::Source::Open({.brokers = cluster->brokers(),
                                .topic = topic,
                                .group = group,
                                .session_timeout_ms = 6'000,
                                .heartbeat_interval_ms = 200,
                                .max_poll_interval_ms = 20'000,
                                .config = {{"fetch.wait.max.ms", "20"},
                                           {"fetch.error.backoff.ms", "20"},
                                           {"reconnect.backoff.ms", "20"},
                                           {"retry.backoff.ms", "20"},
                                           {"topic.metadata.refresh.interval.ms", "500"}},
                                .env = c.env});
  if (!s.ok()) return s.status();
  auto p = kafka::Publisher::Open({.brokers = cluster->brokers(), .topic = topic});
  if (!p.ok()) return p.status();
  std::shared_ptr<kafka::Publisher> pub = std::move(*p);
  SourceHandle h;
  h.publish = [pub](const Message& m) { return pub->Publish(m); };
  h.publisher = pub;
  h.channel = topic;
  h.source = std::make_unique<Fetched>(std::move(*s));
  return h;
}

[[maybe_unused]] const bool kOnKafka = RegisterDeliverySuite({.name = "kafka",
                                                              .promises = {.has_lease = false,
                                                                           .counts_attempts = false,
                                                                           .nack_redelivers_one = false,
                                                                           .reports_lease_lost = false,
                                                                           .survives_fork = false,
                                                                           .headers_as_published = false,
                                                                           .empty_header_names = false},
                                                              .open = OpenKafka,
                                                              .start = StartCluster});

}  // namespace
}  // namespace idem::testing
