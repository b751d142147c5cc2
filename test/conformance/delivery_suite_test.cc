// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The delivery suite's cases (the fixture, the capabilities and the
// registration are in util/delivery_suite.h). A test executable that compiles
// this file runs every case for every source it registers with
// RegisterDeliverySuite, except the cases that need a capability the source
// does not promise (those are not registered; doc/sources.md has the table).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/consumer.h"
#include "idem/inbox.h"
#include "idem/outbox_relay.h"
#include "idem/publisher.h"
#include "idem/sqlite/store.h"
#include "idem/store.h"
#include "idem/testing/kill_points.h"
#include "util/delivery_suite.h"
#include "util/relay_util.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

IDEM_DELIVERY_CASE(PublishReceiveAckRemoves) {
  for (int i = 0; i < 3; ++i) PublishTwice(Msg("m-" + std::to_string(i)));
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(CountIds(got), (std::map<std::string, int>{{"m-0", 2}, {"m-1", 2}, {"m-2", 2}}));
  std::set<std::string> receipts;
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.attempt, Attempt(1)) << d.message.id;
    EXPECT_EQ(d.message.payload, "payload-of-" + d.message.id);
    EXPECT_FALSE(d.receipt.empty());
    receipts.insert(d.receipt);
  }
  EXPECT_EQ(receipts.size(), 6u) << "every delivery has its own receipt";
  for (const Delivery& d : got) EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
  ExpectDrained();
}

IDEM_DELIVERY_CASE(AnAckIsNotRepeatable, &Capabilities::reports_lease_lost) {
  PublishTwice(Msg("m-1"));
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
  ExpectDrained();
  // The message is gone: a second ack of either copy is kLeaseLost.
  for (const Delivery& d : got) EXPECT_EQ(source().Ack(d).code(), Code::kLeaseLost) << d.receipt;
}

IDEM_DELIVERY_CASE(MessagePublishedTwiceIsDeliveredTwiceWithTheSameId) {
  Message m = Msg("order-42", "4000");
  PublishTwice(m);
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.id, "order-42");
    EXPECT_EQ(d.message.payload, "4000");
    EXPECT_EQ(d.message.attempt, Attempt(1));
  }
  EXPECT_NE(got[0].receipt, got[1].receipt);
  for (const Delivery& d : got) EXPECT_TRUE(source().Ack(d).ok()) << d.receipt;
  ExpectDrained();
}

// The copies are independent: acking one leaves the other leased.
IDEM_DELIVERY_CASE(AckingOneCopyLeavesTheOtherLeased, &Capabilities::has_lease) {
  PublishTwice(Msg("order-42", "4000"));
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(source().Ack(got[0]).ok());
  Advance(kLeaseMs + 1);
  std::vector<Delivery> again = ReceiveAll();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].message.id, "order-42");
  EXPECT_EQ(again[0].message.attempt, Attempt(2));
  ASSERT_TRUE(source().Ack(again[0]).ok());
  ExpectDrained();
}

IDEM_DELIVERY_CASE(LeasedMessageIsInvisibleUntilTheLeaseExpiresThenRedelivered, &Capabilities::has_lease) {
  PublishTwice(Msg("m-1"));
  auto first = source().Receive(1, 0);
  ASSERT_OK(first);
  ASSERT_EQ(first->size(), 1u);
  EXPECT_EQ((*first)[0].message.attempt, Attempt(1));
  // The second receiver sees only the other copy, never the leased one.
  std::vector<Delivery> second = ReceiveAll();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].message.attempt, Attempt(1));
  EXPECT_NE(second[0].receipt, (*first)[0].receipt);
  EXPECT_TRUE(ReceiveAll().empty());
  // A Receive that waits less than the lease still sees nothing.
  auto waited = source().Receive(10, kLeaseMs / 2);
  ASSERT_OK(waited);
  EXPECT_TRUE(waited->empty());
  Advance(kLeaseMs);  // now past both leases
  std::vector<Delivery> redelivered = ReceiveAll();
  ASSERT_EQ(redelivered.size(), 2u);
  for (const Delivery& d : redelivered) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.attempt, Attempt(2));
  }
  for (const Delivery& d : redelivered) EXPECT_TRUE(source().Ack(d).ok());
  ExpectDrained();
}

IDEM_DELIVERY_CASE(AWaitingReceiveSeesALeaseExpire, &Capabilities::has_lease) {
  PublishTwice(Msg("m-1"));
  ASSERT_EQ(ReceiveAll().size(), 2u);
  // Receive waits longer than the lease: the messages come back within it.
  auto got = source().Receive(10, kLeaseMs * 2);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 2u);
  for (const Delivery& d : *got) {
    EXPECT_EQ(d.message.attempt, Attempt(2));
    EXPECT_TRUE(source().Ack(d).ok());
  }
  ExpectDrained();
}

IDEM_DELIVERY_CASE(StaleReceiptAfterRedeliveryIsLeaseLostAndDeletesNothing, &Capabilities::has_lease,
                   &Capabilities::reports_lease_lost) {
  auto [stale, fresh] = ReceiveAcrossALeaseExpiry(Msg("m-1"));
  ASSERT_EQ(stale.size(), 2u);
  ASSERT_EQ(fresh.size(), 2u);
  for (const Delivery& d : stale) {
    Status s = source().Ack(d);
    EXPECT_EQ(s.code(), Code::kLeaseLost) << s;
    EXPECT_EQ(source().Nack(d, 0).code(), Code::kLeaseLost);
  }
  // The new deliveries are intact: still leased (invisible), ackable.
  EXPECT_TRUE(ReceiveAll().empty());
  for (const Delivery& d : fresh) {
    EXPECT_EQ(d.message.attempt, Attempt(2));
    EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
  }
  ExpectDrained();
}

IDEM_DELIVERY_CASE(StaleReceiptAfterNackAndRedeliveryIsLeaseLost, &Capabilities::reports_lease_lost) {
  PublishTwice(Msg("m-1"));
  std::vector<Delivery> first = ReceiveAll();
  ASSERT_EQ(first.size(), 2u);
  for (const Delivery& d : first) ASSERT_TRUE(source().Nack(d, 0).ok());
  std::vector<Delivery> second = ReceiveAll();
  ASSERT_EQ(second.size(), 2u);
  for (const Delivery& d : first) EXPECT_EQ(source().Ack(d).code(), Code::kLeaseLost);
  for (const Delivery& d : second) {
    EXPECT_EQ(d.message.attempt, Attempt(2));
    EXPECT_TRUE(source().Ack(d).ok());
  }
  ExpectDrained();
}

// A handler that runs longer than the lease keeps its delivery by extending
// the lease (the Consumer does so every third of lease_ms()). A source
// without leases (lease_ms() == 0) answers OK and holds the delivery anyway.
IDEM_DELIVERY_CASE(ADeliveryWhoseLeaseIsExtendedIsNotRedeliveredMeanwhile) {
  PublishTwice(Msg("m-1"));
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 2u);
  const int64_t lease = source().lease_ms();
  EXPECT_EQ(lease, promises().has_lease ? kLeaseMs : 0) << "the source was opened with a lease of " << kLeaseMs;
  // Five extensions half a lease apart: two and a half leases past the
  // original lease end, and every Receive meanwhile sees nothing.
  for (int round = 0; round < 5; ++round) {
    Advance(kLeaseMs / 2);
    for (const Delivery& d : got) {
      Status s = source().ExtendLease(d);
      EXPECT_TRUE(s.ok()) << "round " << round << ": " << s;
    }
    EXPECT_TRUE(ReceiveAll().empty()) << "redelivered during an extended lease, round " << round;
  }
  // The last extension holds for a whole lease from when it was made.
  Advance(kLeaseMs - 1);
  EXPECT_TRUE(ReceiveAll().empty()) << "the last extension ended early";
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.attempt, Attempt(1));
    Status s = source().Ack(d);
    EXPECT_TRUE(s.ok()) << s;
  }
  ExpectDrained();
}

// An extension cannot bring back a lease that was lost: once the delivery
// expired and was received again, or was acked, ExtendLease of the old
// receipt is kLeaseLost and leaves the new delivery alone.
// (A source without leases has none to lose: ADeliveryWhoseLeaseIsExtended...
// checks that its deliveries stay the consumer's however long it takes.)
IDEM_DELIVERY_CASE(ExtendLeaseAfterTheLeaseWasLostIsLeaseLost, &Capabilities::has_lease,
                   &Capabilities::reports_lease_lost) {
  auto [stale, fresh] = ReceiveAcrossALeaseExpiry(Msg("m-1"));
  ASSERT_EQ(stale.size(), 2u);
  ASSERT_EQ(fresh.size(), 2u);
  for (const Delivery& d : stale) {
    Status s = source().ExtendLease(d);
    EXPECT_EQ(s.code(), Code::kLeaseLost) << s;
  }
  // The new deliveries kept their leases: invisible, extendable, ackable.
  EXPECT_TRUE(ReceiveAll().empty());
  for (const Delivery& d : fresh) {
    EXPECT_EQ(d.message.attempt, Attempt(2));
    EXPECT_TRUE(source().ExtendLease(d).ok()) << d.receipt;
    EXPECT_TRUE(source().Ack(d).ok()) << d.receipt;
    Status s = source().ExtendLease(d);
    EXPECT_EQ(s.code(), Code::kLeaseLost) << "after the ack: " << s;
  }
  ExpectDrained();
}

// Both copies of the only message are nacked: on every source exactly they
// come back (a Kafka seek back finds nothing after them).
IDEM_DELIVERY_CASE(NackWithDelayHidesTheMessageUntilTheDelayPasses) {
  PublishTwice(Msg("m-1"));
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 2u);
  // The delay is longer than the lease: the delay decides, not the lease.
  const int64_t delay = kLeaseMs * 3;
  for (const Delivery& d : got) ASSERT_TRUE(source().Nack(d, delay).ok());
  EXPECT_TRUE(ReceiveAll().empty());
  Advance(kLeaseMs + 1);
  EXPECT_TRUE(ReceiveAll().empty()) << "visible when the lease ran out, before the nack delay";
  Advance(delay - kLeaseMs - 2);
  EXPECT_TRUE(ReceiveAll().empty());
  Advance(2);
  std::vector<Delivery> back = ReceiveAll();
  ASSERT_EQ(back.size(), 2u);
  for (const Delivery& d : back) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.attempt, Attempt(2));
  }
  // Nack without delay: visible again at once.
  for (const Delivery& d : back) ASSERT_TRUE(source().Nack(d, 0).ok());
  std::vector<Delivery> third = ReceiveAll();
  ASSERT_EQ(third.size(), 2u);
  for (const Delivery& d : third) {
    EXPECT_EQ(d.message.attempt, Attempt(3));
    EXPECT_TRUE(source().Ack(d).ok());
  }
  ExpectDrained();
}

IDEM_DELIVERY_CASE(HeadersProducerTimeAndBinaryPayloadsRoundTripByteExact, &Capabilities::headers_as_published,
                   &Capabilities::empty_header_names) {
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  Message rich;
  rich.id = std::string("m\0\xff-1", 5);
  rich.payload = all_bytes + std::string(3, '\0') + all_bytes;
  rich.producer_time_ms = 1'712'345'678'901;
  rich.headers = {{"trace-id", "abc"},
                  {"binary", std::string("\0\x01\xfe\xff", 4)},
                  {"empty", ""},
                  {"", "empty name"},
                  {"trace-id", "second value, same name"}};
  Message plain;
  plain.id = "m-2";
  plain.payload = "";  // an empty payload is a payload
  PublishTwice(rich);
  PublishTwice(plain);
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 4u);
  int rich_seen = 0, plain_seen = 0;
  for (const Delivery& d : got) {
    const Message& m = d.message;
    if (m.id == rich.id) {
      ++rich_seen;
      EXPECT_EQ(m.payload.size(), rich.payload.size());
      EXPECT_TRUE(m.payload == rich.payload);
      ASSERT_TRUE(m.producer_time_ms.has_value());
      EXPECT_EQ(*m.producer_time_ms, *rich.producer_time_ms);
      EXPECT_EQ(m.headers, rich.headers);
      EXPECT_EQ(m.Header("trace-id"), std::optional<std::string_view>("abc"));
    } else {
      ++plain_seen;
      EXPECT_EQ(m.id, "m-2");
      EXPECT_EQ(m.payload, "");
      EXPECT_FALSE(m.producer_time_ms.has_value());
      EXPECT_TRUE(m.headers.empty());
    }
    EXPECT_TRUE(source().Ack(d).ok());
  }
  EXPECT_EQ(rich_seen, 2);
  EXPECT_EQ(plain_seen, 2);
  ExpectDrained();
}

// Nack gives back the nacked copies and nothing else: the message acked
// meanwhile does not come again.
IDEM_DELIVERY_CASE(ANackGivesBackOnlyTheNackedDeliveries, &Capabilities::nack_redelivers_one) {
  PublishTwice(Msg("nacked"));
  PublishTwice(Msg("acked"));
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 4u);
  for (const Delivery& d : got) {
    Status s = d.message.id == "nacked" ? source().Nack(d, 0) : source().Ack(d);
    ASSERT_TRUE(s.ok()) << d.message.id << ": " << s;
  }
  std::vector<Delivery> back = ReceiveAll();
  ASSERT_EQ(back.size(), 2u);
  for (const Delivery& d : back) {
    EXPECT_EQ(d.message.id, "nacked");
    EXPECT_EQ(d.message.attempt, Attempt(2));
    EXPECT_TRUE(source().Ack(d).ok());
  }
  ExpectDrained();
}

// What every source carries byte for byte: the id, the payload, the producer
// time, and the value of a header it was published with (whatever else a
// source adds to the headers; HeadersProducerTimeAndBinaryPayloads... checks
// the headers exactly where they are delivered as published).
IDEM_DELIVERY_CASE(IdPayloadAndProducerTimeRoundTripByteExact) {
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  Message rich;
  rich.id = std::string("m\0\xff-1", 5);
  rich.payload = all_bytes + std::string(3, '\0') + all_bytes;
  rich.producer_time_ms = 1'712'345'678'901;
  rich.headers = {{"trace-id", "abc"}, {"binary", std::string("\0\x01\xfe\xff", 4)}};
  Message plain;
  plain.id = "m-2";
  plain.payload = "";  // an empty payload is a payload
  PublishTwice(rich);
  PublishTwice(plain);
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 4u);
  std::map<std::string, int> seen;
  for (const Delivery& d : got) {
    const Message& m = d.message;
    ++seen[m.id];
    if (m.id == rich.id) {
      EXPECT_TRUE(m.payload == rich.payload) << m.payload.size() << " bytes";
      ASSERT_TRUE(m.producer_time_ms.has_value());
      EXPECT_EQ(*m.producer_time_ms, *rich.producer_time_ms);
      EXPECT_EQ(m.Header("trace-id"), std::optional<std::string_view>("abc"));
      EXPECT_EQ(m.Header("binary"), std::optional<std::string_view>(rich.headers[1].second));
    } else {
      EXPECT_EQ(m.id, "m-2");
      EXPECT_EQ(m.payload, "");
      EXPECT_FALSE(m.producer_time_ms.has_value());
      EXPECT_FALSE(m.Header("trace-id").has_value());
    }
    EXPECT_EQ(m.attempt, Attempt(1));
    EXPECT_TRUE(source().Ack(d).ok());
  }
  EXPECT_EQ(seen, (std::map<std::string, int>{{rich.id, 2}, {"m-2", 2}}));
  ExpectDrained();
}

IDEM_DELIVERY_CASE(ReceiveReturnsAtMostMax) {
  for (int i = 0; i < 5; ++i) PublishTwice(Msg("m-" + std::to_string(i)));
  std::vector<Delivery> all;
  for (int round = 0; round < 20 && all.size() < 10; ++round) {
    auto got = source().Receive(3, 0);
    ASSERT_OK(got);
    EXPECT_LE(got->size(), 3u);
    for (auto& d : *got) all.push_back(std::move(d));
  }
  ASSERT_EQ(all.size(), 10u);
  auto one = source().Receive(1, 0);
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->empty());
  for (auto& c : CountIds(all)) EXPECT_EQ(c.second, 2) << c.first;
  for (const Delivery& d : all) EXPECT_TRUE(source().Ack(d).ok());
  EXPECT_EQ(source().Receive(0, 0).status().code(), Code::kInvalidArgument);
  ExpectDrained();
}

IDEM_DELIVERY_CASE(ConcurrentReceiversGetEachDeliveryExactlyOnceAndLoseNothing) {
  constexpr int kIds = 150, kThreads = 4;
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < kIds; ++i) Publish(Msg("m-" + std::to_string(i)));
  std::mutex mu;
  std::map<std::string, int> received;
  std::atomic<int> acked{0}, ack_errors{0}, receive_errors{0};
  auto worker = [&] {
    int empty_in_a_row = 0;
    while (acked.load() < 2 * kIds && empty_in_a_row < 2000) {
      auto got = source().Receive(1 + static_cast<int>(acked.load() % 4), 0);
      if (!got.ok()) {
        ++receive_errors;
        continue;
      }
      if (got->empty()) {
        ++empty_in_a_row;
        std::this_thread::yield();
        continue;
      }
      empty_in_a_row = 0;
      {
        std::lock_guard<std::mutex> l(mu);
        for (const Delivery& d : *got) ++received[d.message.id];
      }
      for (const Delivery& d : *got) {
        if (d.message.attempt != Attempt(1)) ++ack_errors;  // a second lease while the first was valid
        if (source().Ack(d).ok())
          ++acked;
        else
          ++ack_errors;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  EXPECT_EQ(receive_errors.load(), 0);
  EXPECT_EQ(ack_errors.load(), 0);
  EXPECT_EQ(acked.load(), 2 * kIds);
  ASSERT_EQ(received.size(), static_cast<size_t>(kIds));
  for (auto& [id, n] : received) EXPECT_EQ(n, 2) << id;
  ExpectDrained();
}

IDEM_DELIVERY_CASE(TwoProcessesConsumingOneQueueAckEveryDeliveryExactlyOnce, &Capabilities::survives_fork) {
  constexpr int kIds = 120;
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < kIds; ++i) Publish(Msg("m-" + std::to_string(i)));
  handle_ = {};  // no connection crosses the fork
  auto child = [&](int n) -> int {
    // The real clock and a lease far longer than the test: a second delivery
    // here would be a double lease, not an expiry.
    auto h = Open({.lease_ms = 600'000, .env = Env::Default()});
    if (!h.ok()) return 2;
    std::string log = dir_.File("acked-" + std::to_string(n));
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return 3;
    int empty_in_a_row = 0;
    while (empty_in_a_row < 5) {  // the other process may hold the rest for a while
      auto got = h->source->Receive(4, 50);
      if (!got.ok()) return 4;
      if (got->empty()) {
        ++empty_in_a_row;
        continue;
      }
      empty_in_a_row = 0;
      for (const Delivery& d : *got) {
        if (d.message.attempt != Attempt(1)) return 5;
        if (!h->source->Ack(d).ok()) return 6;
        std::string line = d.message.id + "\n";
        if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 7;
      }
    }
    ::close(fd);
    return 0;
  };
  pid_t a = ::fork();
  if (a == 0) ::_exit(child(0));
  pid_t b = ::fork();
  if (b == 0) ::_exit(child(1));
  int sa = 0, sb = 0;
  ASSERT_EQ(::waitpid(a, &sa, 0), a);
  ASSERT_EQ(::waitpid(b, &sb, 0), b);
  EXPECT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << "child a status " << sa;
  EXPECT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << "child b status " << sb;
  std::map<std::string, int> acked;
  int total = 0;
  for (int n = 0; n < 2; ++n) {
    std::ifstream in(dir_.File("acked-" + std::to_string(n)));
    for (std::string id; std::getline(in, id);) {
      ++acked[id];
      ++total;
    }
  }
  EXPECT_EQ(total, 2 * kIds);
  ASSERT_EQ(acked.size(), static_cast<size_t>(kIds));
  for (auto& [id, n] : acked) EXPECT_EQ(n, 2) << id;
  auto h = Open({.lease_ms = kLeaseMs, .env = &env_});
  ASSERT_OK(h);
  handle_ = std::move(*h);
  ExpectDrained();
}

// A consumer that closes without acknowledging gives its deliveries back: the
// next consumer of the queue (the group, on Kafka) gets them, and nothing that
// was acknowledged before the close.
IDEM_DELIVERY_CASE(ADeliveryNotAckedComesAgainToTheNextConsumerAfterAClose) {
  PublishTwice(Msg("done"));
  std::vector<Delivery> done = ReceiveAll();
  ASSERT_EQ(done.size(), 2u);
  for (const Delivery& d : done) ASSERT_TRUE(source().Ack(d).ok());
  PublishTwice(Msg("pending"));
  std::vector<Delivery> pending = ReceiveAll();
  ASSERT_EQ(pending.size(), 2u);
  for (const Delivery& d : pending) EXPECT_EQ(d.message.id, "pending");
  handle_ = {};  // closed: neither acked nor nacked
  auto h = Open({.lease_ms = kLeaseMs, .env = &env_});
  ASSERT_OK(h);
  handle_ = std::move(*h);
  Advance(kLeaseMs + 1);  // on a source with leases, the closed consumer's run out
  std::vector<Delivery> again = ReceiveAll();
  ASSERT_EQ(again.size(), 2u);
  for (const Delivery& d : again) {
    EXPECT_EQ(d.message.id, "pending");
    EXPECT_EQ(d.message.attempt, Attempt(2));
    EXPECT_TRUE(source().Ack(d).ok());
  }
  ExpectDrained();
}

// Forwards to a source; at every Ack, counts the deliveries whose effect is
// not committed yet (read through a connection of its own).
class AckAfterCommitCheck final : public Source {
 public:
  AckAfterCommitCheck(Source& inner, Store& reader) : inner_(inner), reader_(reader) {}
  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override { return inner_.Receive(max, wait_ms); }
  Status Ack(const Delivery& d) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      ++acks_;
      if (Charges(reader_, d.message.id) != 1) ++acked_before_commit_;
    }
    return inner_.Ack(d);
  }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_.Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_.Kind(); }
  int64_t lease_ms() const override { return inner_.lease_ms(); }
  Status ExtendLease(const Delivery& d) override { return inner_.ExtendLease(d); }
  int acks() {
    std::lock_guard<std::mutex> l(mu_);
    return acks_;
  }
  int acked_before_commit() {
    std::lock_guard<std::mutex> l(mu_);
    return acked_before_commit_;
  }

 private:
  Source& inner_;
  Store& reader_;
  std::mutex mu_;
  int acks_ = 0;
  int acked_before_commit_ = 0;
};

// The Consumer and an Inbox on SQLite over the source: each message published
// twice is applied once, and every delivery is acknowledged only after the
// transaction with its effect committed.
IDEM_DELIVERY_CASE(ThroughTheInboxEachMessageIsAppliedOnceAndAckedAfterItsCommit) {
  constexpr int kIds = 20;
  auto store = sqlite::Store::Open({.path = dir_.File("store.db")});
  ASSERT_OK(store);
  ASSERT_TRUE(CreatePayments(**store).ok());
  auto reader = sqlite::Store::Open({.path = dir_.File("store.db")});
  ASSERT_OK(reader);
  for (int i = 0; i < kIds; ++i) PublishTwice(Msg("m-" + std::to_string(i)));
  AckAfterCommitCheck checked(source(), **reader);
  auto inbox = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "suite"});
  auto consumer = MustOpen<Consumer>(
      checked, *inbox, ChargeHandler(),
      Consumer::Options{
          .workers = 2, .backoff_base_ms = 5, .backoff_max_ms = 50, .receive_wait_ms = 20, .stop_when_idle = true});
  Status run = consumer->Run();
  ASSERT_TRUE(run.ok()) << run;
  for (int i = 0; i < kIds; ++i) EXPECT_EQ(Charges(**store, "m-" + std::to_string(i)), 1) << i;
  EXPECT_EQ(Charges(**store), kIds);
  EXPECT_GE(checked.acks(), 2 * kIds) << "every copy is acknowledged";
  EXPECT_EQ(checked.acked_before_commit(), 0);
  EXPECT_EQ(consumer->stats().dead_lettered, 0u);
  ExpectDrained();
}

// ---------------------------------------------------------------------------
// PublishBatch (the outbox relay's way in): every source's Publisher.
// ---------------------------------------------------------------------------

// `n` messages "b-<i>" over `keys` keys "key-<i % keys>", payload "<i>".
struct KeyedBatch {
  KeyedBatch(int n, int keys, std::string_view destination = {}) {
    for (int i = 0; i < n; ++i) {
      messages.push_back(Msg("b-" + std::to_string(i), std::to_string(i)));
      key_names.push_back("key-" + std::to_string(i % keys));
    }
    for (int i = 0; i < n; ++i) outgoing.push_back({destination, key_names[i], &messages[i]});
  }
  std::vector<Message> messages;
  std::vector<std::string> key_names;
  std::vector<Outgoing> outgoing;
};

IDEM_DELIVERY_CASE(ABatchToTheOwnChannelIsReadBackCompleteWithItsOrderingKeys, &Capabilities::keys_in_parallel) {
  constexpr int kN = 50;
  KeyedBatch b(kN, 5);
  EXPECT_EQ(publisher().Channel(), handle_.channel);
  EXPECT_GE(publisher().traits().max_batch, kN);
  PublishBatch(b.outgoing);
  PublishBatch(b.outgoing);  // a relay's republish: every id twice
  std::vector<Delivery> got = ReceiveN(source(), 2 * kN);
  ASSERT_EQ(got.size(), 2u * kN);
  std::map<std::string, int> seen = CountIds(got);
  ASSERT_EQ(seen.size(), static_cast<size_t>(kN));
  for (const auto& [id, n] : seen) EXPECT_EQ(n, 2) << id;
  for (const Delivery& d : got) {
    const int i = std::stoi(d.message.payload);
    EXPECT_EQ(d.message.id, "b-" + std::to_string(i));
    EXPECT_EQ(d.message.Header(kOrderingKeyHeader), std::optional<std::string_view>(b.key_names[i])) << d.message.id;
    EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
  }
  ExpectDrained();
}

// Per key, the messages arrive in the order they were handed over: in one
// batch where the publisher promises ordered batches, else in batches that
// hold one message per key (as the outbox relay sends them).
IDEM_DELIVERY_CASE(BatchesKeepTheOrderOfEachKey, &Capabilities::keys_in_parallel) {
  constexpr int kN = 40, kKeys = 4;
  KeyedBatch b(kN, kKeys);
  const bool ordered = publisher().traits().ordered_batch;
  for (int round = 0; round < 2; ++round) {
    if (ordered) {
      PublishBatch(b.outgoing);
    } else {
      for (int i = 0; i < kN; i += kKeys) PublishBatch(std::span<const Outgoing>(b.outgoing).subspan(i, kKeys));
    }
  }
  std::vector<Delivery> got = ReceiveN(source(), 2 * kN);
  ASSERT_EQ(got.size(), 2u * kN);
  std::map<std::string, std::vector<int>> order;  // per key, the payloads as received
  for (const Delivery& d : got) {
    const int i = std::stoi(d.message.payload);
    order[b.key_names[i]].push_back(i);
    EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
  }
  ASSERT_EQ(order.size(), static_cast<size_t>(kKeys));
  for (int k = 0; k < kKeys; ++k) {
    std::vector<int> want;
    for (int round = 0; round < 2; ++round)
      for (int i = k; i < kN; i += kKeys) want.push_back(i);
    EXPECT_EQ(order["key-" + std::to_string(k)], want) << "key-" << k << (ordered ? " (one batch)" : " (batches)");
  }
  ExpectDrained();
}

// An element the broker can never carry (an empty id, no message) answers
// kInvalidArgument; the others are published (on the embedded queue too:
// the refused elements are left out of its one transaction).
IDEM_DELIVERY_CASE(AnInvalidElementIsRefusedAndTheOthersArePublished, &Capabilities::keys_in_parallel) {
  Message good_a = Msg("good-a", "a"), bad = Msg("", "no id"), good_b = Msg("good-b", "b");
  const Outgoing batch[] = {{{}, "k-1", &good_a}, {{}, "k-2", &bad}, {{}, "k-3", nullptr}, {{}, "k-1", &good_b}};
  for (int round = 0; round < 2; ++round) {
    std::vector<Status> st = publisher().PublishBatch(batch);
    ASSERT_EQ(st.size(), 4u);
    EXPECT_TRUE(st[0].ok()) << st[0];
    EXPECT_EQ(st[1].code(), Code::kInvalidArgument) << st[1];
    EXPECT_EQ(st[2].code(), Code::kInvalidArgument) << st[2];
    EXPECT_TRUE(st[3].ok()) << st[3];
  }
  std::vector<Delivery> got = ReceiveN(source(), 4);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(CountIds(got), (std::map<std::string, int>{{"good-a", 2}, {"good-b", 2}}));
  for (const Delivery& d : got) EXPECT_TRUE(source().Ack(d).ok());
  ExpectDrained();
}

// A destination names another queue, stream or topic than the publisher's
// own channel: its messages go there, the others to the channel.
IDEM_DELIVERY_CASE(ADestinationOtherThanTheChannelIsPublishedThere, &Capabilities::keys_in_parallel) {
  auto other = Open({.lease_ms = kLeaseMs, .env = &env_, .other_channel = true});
  ASSERT_OK(other);
  ASSERT_NE(other->channel, handle_.channel);
  Message there = Msg("there", "1"), here = Msg("here", "2");
  const Outgoing batch[] = {{other->channel, "k", &there}, {{}, "k", &here}};
  PublishBatch(batch);
  PublishBatch(batch);
  std::vector<Delivery> got_there = ReceiveN(*other->source, 2);
  ASSERT_EQ(got_there.size(), 2u);
  EXPECT_EQ(CountIds(got_there), (std::map<std::string, int>{{"there", 2}}));
  for (const Delivery& d : got_there) EXPECT_TRUE(other->source->Ack(d).ok());
  std::vector<Delivery> got_here = ReceiveN(source(), 2);
  ASSERT_EQ(got_here.size(), 2u);
  EXPECT_EQ(CountIds(got_here), (std::map<std::string, int>{{"here", 2}}));
  for (const Delivery& d : got_here) EXPECT_TRUE(source().Ack(d).ok());
  ExpectDrained();
  auto left = other->source->Receive(10, 0);
  ASSERT_OK(left);
  EXPECT_TRUE(left->empty()) << left->size() << " left on the other channel";
}

// ---------------------------------------------------------------------------
// The outbox relay (idem/outbox_relay.h): from a SQLite store's outbox to
// the source's Publisher, read back through the source.
// ---------------------------------------------------------------------------

// Every message is added twice with the same id (a producer that retried its
// transaction): two rows, each published once, each read back with its
// bytes and headers, each key's rows in seq order.
IDEM_DELIVERY_CASE(TheOutboxRelayPublishesEveryRowIntactAndEachKeyInOrder, &Capabilities::keys_in_parallel) {
  constexpr int kN = 120, kKeys = 6;
  RelayWorkload w(kN, kKeys);
  auto store = OpenOutboxStore(dir_.File("outbox.db"));
  ASSERT_OK(store);
  for (int add = 0; add < 2; ++add) ASSERT_TRUE(AddInTransactions(**store, w.messages, 15).ok());
  auto stats = DrainOutbox(**store, publisher(), DrainOptions(50));
  ASSERT_OK(stats);
  EXPECT_EQ(stats->published, 2u * kN);
  EXPECT_EQ(stats->republished, 0u);
  std::vector<Delivery> got = ReceiveN(source(), 2 * kN);
  ASSERT_EQ(got.size(), 2u * kN);
  std::map<RelayedRow, int> copies = ExpectRelayed(w, got, 2);
  for (const auto& [row, n] : copies) EXPECT_EQ(n, 1) << row.first << " seq " << row.second;
  for (const Delivery& d : got) EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
  ExpectDrained();
}

// A relay in a child process is SIGKILLed at each of the relay's kill points
// in turn (in this process, where a source does not survive fork(): below), with rows confirmed by the broker and not
// yet settled (or just settled); a fresh relay then drains the outbox. Every row arrives, a row arrives again only when
// the killed relay had it confirmed (a republish: same id, bytes and seq), and each key's first copies keep seq order.
IDEM_DELIVERY_CASE(ARelayKilledAtEachKillPointLosesNothingAndRepublishesOnlyWhatItHadSent,
                   &Capabilities::keys_in_parallel) {
  struct Kill {
    const char* point;
    int hit;
    // Whether the killed relay leaves rows confirmed and not settled (which
    // the next relay publishes again); before_publish may or may not,
    // depending on the publisher's batches.
    std::optional<bool> republishes;
  };
  // 120 rows fetched 20 at a time: one or several PublishBatch per fetch.
  const Kill kills[] = {{"relay.before_publish", 4, std::nullopt},
                        {"relay.after_publish", 3, true},
                        {"relay.before_settle_commit", 2, true},
                        {"relay.after_settle", 2, false}};
  constexpr int kN = 60, kKeys = 6, kBatch = 20;
  int round = 0;
  // The copies of publishes that ended in doubt, not received yet (they may
  // come in a later round: the channel is the same).
  std::map<RelayedRow, int> in_doubt;
  // The rows received and acknowledged in earlier rounds (RedeliveryOfSettled).
  std::set<RelayedRow> settled;
  for (const Kill& kill : kills) {
    SCOPED_TRACE(kill.point);
    const std::string tag = "r" + std::to_string(round++);
    RelayWorkload w(kN, kKeys, tag);
    const std::string db = dir_.File(tag + ".db"), child_log = dir_.File(tag + "-child.log"),
                      fresh_log = dir_.File(tag + "-fresh.log");
    {
      auto store = OpenOutboxStore(db);
      ASSERT_OK(store);
      for (int add = 0; add < 2; ++add) ASSERT_TRUE(AddInTransactions(**store, w.messages, 7).ok());
    }
    // The killed relay: its own store handle, logging what its broker confirmed.
    // Returns only if it drained before the kill point's hit.
    // Its first batch's items 1..3 end in doubt though the broker has them
    // (as when their confirms come late on a loaded broker): the relay
    // publishes them again, and the channel holds a copy of each that was
    // never confirmed.
    auto relay_until_killed = [&](Publisher& to, std::function<void()> action) {
      auto store = OpenOutboxStore(db);
      if (!store.ok()) return;
      DoubtfulPublisher doubtful(to, 1, 1, 4);
      LoggingPublisher logged(doubtful, child_log);
      ArmKillPoint(kill.point, kill.hit, std::move(action));
      (void)DrainOutbox(**store, logged, DrainOptions(kBatch));
    };
    if (promises().survives_fork) {
      handle_ = {};  // no connection crosses the fork
      const int status = RunInChild([&]() -> int {
        // The suite's clock: what the child publishes is visible at the
        // parent's (fake) now.
        auto h = Open({.lease_ms = kLeaseMs, .env = &env_});
        if (!h.ok()) return 3;
        relay_until_killed(*h->publisher, {});
        return 4;
      });
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
      auto h = Open({.lease_ms = kLeaseMs, .env = &env_});
      ASSERT_OK(h);
      handle_ = std::move(*h);
    } else {
      // Not across a fork (librdkafka): the kill point's action throws, which
      // unwinds the relay in this process as a crash ends it (its
      // transaction rolled back, its session and lane lock dropped, nothing
      // settled after the point).
      struct Killed {};
      bool killed = false;
      try {
        relay_until_killed(publisher(), [] { throw Killed{}; });
      } catch (const Killed&) {
        killed = true;
      }
      DisarmKillPoints();
      ASSERT_TRUE(killed) << "the relay drained before " << kill.point << " hit " << kill.hit;
    }
    auto store = OpenOutboxStore(db);
    ASSERT_OK(store);
    LoggingPublisher logged(publisher(), fresh_log);
    auto stats = DrainOutbox(**store, logged, DrainOptions(kBatch));
    ASSERT_OK(stats);
    std::map<RelayedRow, int> before = ReadPublishLog(child_log), after = ReadPublishLog(fresh_log);
    const std::map<RelayedRow, int> confirmed = MergeLogs({before, after});
    size_t again = 0;
    for (const auto& [row, n] : after) again += before.count(row);
    EXPECT_FALSE(before.empty()) << "the child confirmed nothing before it was killed";
    if (kill.republishes.has_value()) {
      EXPECT_EQ(again > 0, *kill.republishes) << again << " rows published again";
    }
    EXPECT_LE(again, stats->republished);
    for (const auto& [row, n] : MergeLogs({ReadPublishLog(LoggingPublisher::InDoubtLog(child_log)),
                                           ReadPublishLog(LoggingPublisher::InDoubtLog(fresh_log))}))
      in_doubt[row] += n;
    std::vector<Delivery> got =
        ReceiveConfirmed(source(), confirmed, in_doubt, settled, [&](size_t n) { return ReceiveN(source(), n); });
    ASSERT_EQ(got.size(), CountCopies(confirmed));
    ExpectCopiesAsConfirmed(ExpectRelayed(w, got, 2), confirmed);
    for (const Delivery& d : got) {
      EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
      settled.insert({d.message.id, OutboxSeq(d.message).value_or(-1)});
    }
  }
  // The copies in doubt not received yet, then nothing: a copy too many of
  // an earlier round would have shown in a later one (not of its workload);
  // one of the last round shows here.
  for (Delivery& d : ReceiveAll()) {
    if (RedeliveryOfSettled(d, settled)) {
      EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
      continue;
    }
    auto m = in_doubt.find({d.message.id, OutboxSeq(d.message).value_or(-1)});
    EXPECT_TRUE(m != in_doubt.end() && m->second-- > 0) << d.message.id << " was delivered, never published";
    EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
  }
  ExpectDrained();
}

}  // namespace
}  // namespace idem::testing
