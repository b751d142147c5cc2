// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The delivery suite: what every at-least-once Source must do, written
// against idem::Source plus a publish hook, so that other sources (Redis,
// RabbitMQ, Kafka) can be instantiated into it unchanged.
//
// To run it for a source: add test/delivery_suite_test.cc (the TEST_Ps) to the
// test executable, and instantiate the fixture with that source's open hook:
//
//   INSTANTIATE_TEST_SUITE_P(Sources, DeliverySuite,
//                            ::testing::Values(SourceParam{"redis_streams", OpenStreams, {}}),
//                            [](const auto& p) { return p.param.name; });
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
#include <string>
#include <utility>
#include <vector>

#include "idem/env.h"
#include "idem/message.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/testing/fake_env.h"
#include "util/test_util.h"

namespace idem::testing {

// ---------------------------------------------------------------------------
// The parameter: how to open a source under test.
// ---------------------------------------------------------------------------

struct SourceConfig {
  // The visibility timeout (lease) the source must use.
  int64_t lease_ms = 30'000;
  // The clock the source must read. The suite passes a FakeEnv, except in a
  // forked child, which passes Env::Default().
  Env* env = nullptr;
};

// One open handle on the suite's queue.
struct SourceHandle {
  std::unique_ptr<Source> source;
  // Appends a message, as a producer would.
  std::function<Status(const Message&)> publish;
};

struct SourceParam {
  std::string name;
  // Opens a handle on the queue that belongs to `dir`: the same dir gives the
  // same queue, also from another process (a forked child).
  std::function<Result<SourceHandle>(const TempDir& dir, const SourceConfig& config)> open;
  // Moves the source's clock forward by `ms` (lease expiry, nack delays).
  // Empty: the source reads the FakeEnv, which is advanced. A broker that
  // keeps its own clock supplies a hook that waits instead.
  std::function<void(FakeEnv& env, int64_t ms)> advance;
};

inline void PrintTo(const SourceParam& p, std::ostream* os) { *os << p.name; }

class DeliverySuite : public ::testing::TestWithParam<SourceParam> {
 protected:
  static constexpr int64_t kLeaseMs = 10'000;

  void SetUp() override {
    auto h = GetParam().open(dir_, {.lease_ms = kLeaseMs, .env = &env_});
    ASSERT_TRUE(h.ok()) << h.status();
    handle_ = std::move(*h);
  }
  Source& source() { return *handle_.source; }
  void Publish(const Message& m) { ASSERT_TRUE(handle_.publish(m).ok()) << m.id; }
  void PublishTwice(const Message& m) {
    Publish(m);
    Publish(m);
  }
  void Advance(int64_t ms) {
    if (GetParam().advance) GetParam().advance(env_, ms);
    else env_.Advance(ms);
  }
  // Everything visible now, without waiting.
  std::vector<Delivery> ReceiveAll(int max = 1000) {
    auto got = source().Receive(max, 0);
    EXPECT_TRUE(got.ok()) << got.status();
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
  SourceHandle handle_;
};

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_DELIVERY_SUITE_H_
