// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The delivery suite: what every at-least-once Source must do, written
// against idem::Source plus a publish hook, so that every source (the
// embedded queue, Redis Streams, RabbitMQ, Kafka) runs the same cases.
//
// A source declares what it promises (Capabilities, below). Every case names
// the capabilities it needs; a source runs exactly the cases whose needs it
// promises. A case a source does not promise is not registered for it (not
// skipped at run time): `--gtest_list_tests` shows what runs, and
// doc/sources.md keeps the table of which cases run on which source and why.
//
// To run the suite for a source: add test/delivery_suite_test.cc (the cases)
// to the test executable, and register the source next to its open hook:
//
//   [[maybe_unused]] const bool kOnStreams = RegisterDeliverySuite({
//       .name = "redis_streams",
//       .promises = {.has_lease = true, .counts_attempts = true, ...},
//       .open = OpenStreams});
//
// The tests are named "Sources/DeliverySuite.<Case>/<source name>".
//
// Every test delivers every message at least twice: it is published twice
// (a producer retry), or redelivered.
#ifndef IDEM_TEST_UTIL_DELIVERY_SUITE_H_
#define IDEM_TEST_UTIL_DELIVERY_SUITE_H_

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "idem/env.h"
#include "idem/message.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/testing/fake_env.h"
#include "util/test_util.h"

namespace idem::testing {

// ---------------------------------------------------------------------------
// What a source promises, beyond what every source does (every message
// delivered until acknowledged, to the next consumer after a close; a copy
// published twice delivered twice with its id, payload and producer time;
// at most `max` per Receive; many receivers at once).
// ---------------------------------------------------------------------------

struct Capabilities {
  // A delivery not acknowledged within lease_ms() is delivered again while
  // its consumer still runs (a visibility timeout); ExtendLease renews it.
  // false: lease_ms() is 0, a delivery is the consumer's until acknowledged
  // or closed (Kafka: while its partition stays assigned).
  bool has_lease = false;
  // Message::attempt counts deliveries: 1, then 2, 3 after redeliveries.
  // false: it is always 0 (unknown), which the cases check instead.
  bool counts_attempts = false;
  // Nack gives back exactly the nacked delivery. false: it gives back more
  // (Kafka seeks the partition back: the records after it come again too).
  bool nack_redelivers_one = false;
  // Ack, Nack and ExtendLease of a delivery that is no longer the
  // consumer's (acked already, or redelivered) are Code::kLeaseLost. false:
  // they may be OK (Kafka: an ack commits an offset prefix of a partition
  // that is still assigned).
  bool reports_lease_lost = false;
  // A fork()ed child can open the source and consume (false: librdkafka and
  // its mock cluster's threads do not survive a plain fork()).
  bool survives_fork = false;
  // Message::headers are exactly the published headers. false: the source
  // adds its own (Kafka: the id's and the producer time's record headers).
  bool headers_as_published = false;
  // A header with an empty name round-trips (false: rabbitmq-c 0.11 cannot
  // decode one).
  bool empty_header_names = false;
  // The messages of one ordering key (Outgoing::key) are all delivered
  // while the earlier ones are not acknowledged yet. false: a key's next
  // message waits until the one before is acknowledged (an SQS FIFO queue's
  // message group). The only promise that defaults to true, so that sources
  // registered before it keep every case.
  bool keys_in_parallel = true;

  // Every promise the suite knows (every case runs on such a source).
  static constexpr Capabilities All() {
    return {.has_lease = true,
            .counts_attempts = true,
            .nack_redelivers_one = true,
            .reports_lease_lost = true,
            .survives_fork = true,
            .headers_as_published = true,
            .empty_header_names = true,
            .keys_in_parallel = true};
  }
};

// A capability, as a case names it.
using Capability = bool Capabilities::*;

// ---------------------------------------------------------------------------
// The parameter: how to open a source under test.
// ---------------------------------------------------------------------------

struct SourceConfig {
  // The visibility timeout (lease) the source must use.
  int64_t lease_ms = 30'000;
  // The clock the source must read. The suite passes a FakeEnv, except in a
  // forked child, which passes Env::Default().
  Env* env = nullptr;
  // What SourceParam::start returned for this test (null without it).
  std::shared_ptr<void> broker;
  // Open the test's second channel (another queue, stream or topic of the
  // same broker, created by the hook), not its own.
  bool other_channel = false;
};

// One open handle on the suite's queue.
struct SourceHandle {
  std::unique_ptr<Source> source;
  // Appends a message, as a producer would.
  std::function<Status(const Message&)> publish;
  // The adapter's Publisher, opened on this handle's channel (for
  // PublishBatch), and that channel's name (the destination of its
  // messages for a publisher of another channel).
  std::shared_ptr<Publisher> publisher;
  std::string channel;
};

struct SourceParam {
  std::string name;
  // What the source promises: which cases run on it.
  Capabilities promises;
  // Opens a handle on the queue that belongs to `dir`: the same dir gives the
  // same queue, also from another process (a forked child), and a handle
  // opened after another closed is the next consumer of that queue.
  std::function<Result<SourceHandle>(const TempDir& dir, const SourceConfig& config)> open;
  // Moves the source's clock forward by `ms` (lease expiry, nack delays).
  // Empty: the source reads the FakeEnv, which is advanced. A broker that
  // keeps its own clock supplies a hook that waits instead.
  std::function<void(FakeEnv& env, int64_t ms)> advance;
  // Starts, once per test and before its first open, a broker that runs
  // inside the test process (Kafka: librdkafka's mock cluster). The fixture
  // keeps it until the test's last handle closed; `open` finds it in
  // SourceConfig::broker. Empty: the broker runs outside the tests.
  std::function<Result<std::shared_ptr<void>>(const TempDir& dir)> start;
};

inline void PrintTo(const SourceParam& p, std::ostream* os) { *os << p.name; }

class DeliverySuite : public ::testing::Test {
 protected:
  static constexpr int64_t kLeaseMs = 10'000;

  void SetUp() override {
    if (GetParam().start) {
      auto b = GetParam().start(dir_);
      ASSERT_OK(b);
      broker_ = std::move(*b);
    }
    auto h = Open({.lease_ms = kLeaseMs, .env = &env_});
    ASSERT_OK(h);
    handle_ = std::move(*h);
  }
  const SourceParam& GetParam() const { return *param_; }
  const Capabilities& promises() const { return param_->promises; }
  // Opens another handle on this test's queue.
  Result<SourceHandle> Open(SourceConfig config) {
    config.broker = broker_;
    return GetParam().open(dir_, config);
  }
  Source& source() { return *handle_.source; }
  void Publish(const Message& m) { ASSERT_TRUE(handle_.publish(m).ok()) << m.id; }
  void PublishTwice(const Message& m) {
    Publish(m);
    Publish(m);
  }
  Publisher& publisher() { return *handle_.publisher; }
  // PublishBatch, and every element's status must be `want` (OK by default).
  void PublishBatch(std::span<const Outgoing> batch) {
    std::vector<Status> got = publisher().PublishBatch(batch);
    ASSERT_EQ(got.size(), batch.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(got[i].ok()) << "element " << i << ": " << got[i];
  }
  // Receives from `s` until `n` deliveries came (or a round saw nothing).
  static std::vector<Delivery> ReceiveN(Source& s, size_t n) {
    std::vector<Delivery> out;
    for (int empty = 0; out.size() < n && empty < 3;) {
      auto got = s.Receive(static_cast<int>(n - out.size()), 0);
      EXPECT_OK(got);
      if (!got.ok() || got->empty()) {
        ++empty;
        continue;
      }
      for (Delivery& d : *got) out.push_back(std::move(d));
    }
    return out;
  }
  void Advance(int64_t ms) {
    if (GetParam().advance)
      GetParam().advance(env_, ms);
    else
      env_.Advance(ms);
  }
  // What Message::attempt is on the n-th delivery: n, or 0 on a source that
  // does not count them.
  int Attempt(int n) const { return promises().counts_attempts ? n : 0; }
  // Everything visible now, without waiting.
  std::vector<Delivery> ReceiveAll(int max = 1000) {
    auto got = source().Receive(max, 0);
    EXPECT_OK(got);
    return got.ok() ? std::move(*got) : std::vector<Delivery>{};
  }
  // Publishes `m` twice, receives both copies, lets their leases run out and
  // receives them again: {the first deliveries (stale now), the new ones}.
  // The callers check the sizes (2 each for a source with leases).
  std::pair<std::vector<Delivery>, std::vector<Delivery>> ReceiveAcrossALeaseExpiry(const Message& m) {
    PublishTwice(m);
    std::vector<Delivery> stale = ReceiveAll();
    Advance(kLeaseMs + 1);
    return {std::move(stale), ReceiveAll()};
  }
  // Nothing is left: not now, and not once every lease and delay ran out.
  void ExpectDrained() {
    EXPECT_TRUE(ReceiveAll().empty());
    Advance(kLeaseMs * 10);
    std::vector<Delivery> left = ReceiveAll();
    EXPECT_TRUE(left.empty()) << left.size() << " deliveries left, first " << left.front().message.id;
  }
  static std::map<std::string, int> CountIds(const std::vector<Delivery>& ds) {
    std::map<std::string, int> n;
    for (const Delivery& d : ds) ++n[d.message.id];
    return n;
  }

  TempDir dir_;
  // Starts at the real time, so that leases a forked child takes with the
  // real clock compare sensibly with this one.
  FakeEnv env_{Env::Default()->NowMs()};
  std::shared_ptr<void> broker_;  // outlives handle_ (declared first)
  SourceHandle handle_;

 private:
  friend class DeliverySuiteRegistry;
  const SourceParam* param_ = nullptr;
};

// ---------------------------------------------------------------------------
// Registration: every case for every source that promises what it needs.
// ---------------------------------------------------------------------------

struct DeliveryCase {
  std::string name;
  std::vector<Capability> needs;
  std::function<DeliverySuite*()> make;
  const char* file = "";
  int line = 0;
};

class DeliverySuiteRegistry {
 public:
  static DeliverySuiteRegistry& Get() {
    static DeliverySuiteRegistry* r = new DeliverySuiteRegistry;  // never destroyed: tests keep pointers in it
    return *r;
  }
  // Static initialisers of different files call these in any order: each
  // registers the tests of the new entry with every entry of the other kind.
  bool AddCase(DeliveryCase c) {
    cases_.push_back(std::make_unique<DeliveryCase>(std::move(c)));
    for (const auto& s : sources_) Register(*cases_.back(), *s);
    return true;
  }
  bool AddSource(SourceParam p) {
    sources_.push_back(std::make_unique<SourceParam>(std::move(p)));
    for (const auto& c : cases_) Register(*c, *sources_.back());
    return true;
  }
  static bool Runs(const DeliveryCase& c, const SourceParam& s) {
    for (Capability need : c.needs)
      if (!(s.promises.*need)) return false;
    return true;
  }
  const std::vector<std::unique_ptr<DeliveryCase>>& cases() const { return cases_; }
  const std::vector<std::unique_ptr<SourceParam>>& sources() const { return sources_; }

 private:
  static void Register(const DeliveryCase& c, const SourceParam& s) {
    if (!Runs(c, s)) return;
    const DeliveryCase* cp = &c;
    const SourceParam* sp = &s;
    ::testing::RegisterTest("Sources/DeliverySuite", (c.name + "/" + s.name).c_str(), nullptr, s.name.c_str(), c.file,
                            c.line, [cp, sp]() -> DeliverySuite* {
                              DeliverySuite* t = cp->make();
                              t->param_ = sp;
                              return t;
                            });
  }
  std::vector<std::unique_ptr<DeliveryCase>> cases_;
  std::vector<std::unique_ptr<SourceParam>> sources_;
};

// Registers the suite's cases for `source` (call from a namespace-scope
// initialiser, next to the source's open hook).
inline bool RegisterDeliverySuite(SourceParam source) {
  return DeliverySuiteRegistry::Get().AddSource(std::move(source));
}

// Defines a case; the arguments after the name are the capabilities it
// needs (none: it runs on every source):
//   IDEM_DELIVERY_CASE(AckIsNotRepeatable, &Capabilities::reports_lease_lost) { ... }
#define IDEM_DELIVERY_CASE(case_name, ...)                                                                       \
  class DeliverySuite_##case_name final : public ::idem::testing::DeliverySuite {                                \
   public:                                                                                                       \
    void TestBody() override;                                                                                    \
  };                                                                                                             \
  [[maybe_unused]] const bool kDeliveryCase_##case_name = ::idem::testing::DeliverySuiteRegistry::Get().AddCase( \
      {#case_name,                                                                                               \
       {__VA_ARGS__},                                                                                            \
       [] { return static_cast<::idem::testing::DeliverySuite*>(new DeliverySuite_##case_name); },               \
       __FILE__,                                                                                                 \
       __LINE__});                                                                                               \
  void DeliverySuite_##case_name::TestBody()

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_DELIVERY_SUITE_H_
