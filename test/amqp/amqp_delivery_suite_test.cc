// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The delivery suite (util/delivery_suite.h, delivery_suite_test.cc) on
// idem::amqp::Source: a quorum queue (exact delivery counts through
// x-delivery-count) and the source's optional leases, on the fixture's
// broker.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "idem/amqp/source.h"
#include "util/delivery_suite.h"
#include "util/test_servers.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

std::string SuiteUrl() { return FixtureServerUrl("rabbitmq", ""); }

// RabbitMQ pushes deliveries to a consumer asynchronously: a message whose
// publish the broker confirmed reaches the consumer's socket a moment later,
// and so does one that a nack or an expired lease gave back. The suite's
// Receive(max, 0) means "whatever is visible now"; on RabbitMQ that is
// whatever arrives until the socket has stayed quiet for 250 ms of real time
// (at most 10 s: a requeue on a quorum queue goes through Raft first, which
// on a loaded CI machine can take longer than a short window). Everything else is passed through unchanged.
class Settled final : public Source {
 public:
  explicit Settled(std::unique_ptr<amqp::Source> inner) : inner_(std::move(inner)) {}

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    auto got = inner_->Receive(max, wait_ms);
    if (!got.ok()) return got;
    std::vector<Delivery> out = std::move(*got);
    using Clock = std::chrono::steady_clock;
    const auto hard = Clock::now() + std::chrono::seconds(10);
    constexpr auto kQuiet = std::chrono::milliseconds(250);
    auto quiet_until = Clock::now() + kQuiet;
    while (static_cast<int>(out.size()) < max && Clock::now() < quiet_until && Clock::now() < hard) {
      auto more = inner_->Receive(max - static_cast<int>(out.size()), 0);
      if (!more.ok()) break;
      if (more->empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      for (Delivery& d : *more) out.push_back(std::move(d));
      quiet_until = Clock::now() + kQuiet;
    }
    return out;
  }
  Status Ack(const Delivery& d) override { return inner_->Ack(d); }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_->Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_->Kind(); }
  int64_t lease_ms() const override { return inner_->lease_ms(); }
  Status ExtendLease(const Delivery& d) override { return inner_->ExtendLease(d); }

 private:
  std::unique_ptr<amqp::Source> inner_;
};

// The queue of `dir`: the same in a forked child, named after the test, its
// process and the time (util/test_servers.h), never another test's or run's.
std::string QueueFor(const TempDir& dir) { return ServerNameFor(dir, "idem-suite-"); }

Result<SourceHandle> OpenAmqp(const TempDir& dir, const SourceConfig& c) {
  if (SuiteUrl().empty()) return Status::Unavailable("no broker (run via ctest, which starts it)");
  const std::string q = QueueFor(dir) + (c.other_channel ? "-other" : "");
  // The source declares the quorum queue; the publisher then only publishes.
  auto s = amqp::Source::Open(
      {.url = SuiteUrl(), .queue = q, .prefetch = 1000, .queue_type = "quorum", .lease_ms = c.lease_ms, .env = c.env});
  if (!s.ok()) return s.status();
  auto p = amqp::Publisher::Open({.url = SuiteUrl(), .queue = q});
  if (!p.ok()) return p.status();
  std::shared_ptr<amqp::Publisher> pub = std::move(*p);
  SourceHandle h;
  h.publish = [pub, q](const Message& m) { return pub->Publish(q, m); };
  h.publisher = pub;
  h.channel = q;
  h.source = std::make_unique<Settled>(std::move(*s));
  return h;
}

// A quorum queue counts deliveries (x-delivery-count) and the source's
// optional lease is on. rabbitmq-c 0.11 cannot decode a header with an empty
// name (the Publisher refuses one; amqp_source_test.cc checks the refusal).
[[maybe_unused]] const bool kOnRabbitMq = RegisterDeliverySuite({.name = "rabbitmq",
                                                                 .promises = {.has_lease = true,
                                                                              .counts_attempts = true,
                                                                              .nack_redelivers_one = true,
                                                                              .reports_lease_lost = true,
                                                                              .survives_fork = true,
                                                                              .headers_as_published = true,
                                                                              .empty_header_names = false},
                                                                 .open = OpenAmqp});

}  // namespace
}  // namespace idem::testing
