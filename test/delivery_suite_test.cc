// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The delivery suite's tests (the fixture and its parameter are in
// util/delivery_suite.h). A test executable that compiles this file runs them
// for every source it instantiates DeliverySuite with.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "util/delivery_suite.h"

namespace idem::testing {
namespace {

TEST_P(DeliverySuite, PublishReceiveAckRemoves) {
  for (int i = 0; i < 3; ++i) PublishTwice(Msg("m-" + std::to_string(i)));
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(CountIds(got), (std::map<std::string, int>{{"m-0", 2}, {"m-1", 2}, {"m-2", 2}}));
  std::set<std::string> receipts;
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.attempt, 1) << d.message.id;
    EXPECT_EQ(d.message.payload, "payload-of-" + d.message.id);
    EXPECT_FALSE(d.receipt.empty());
    receipts.insert(d.receipt);
  }
  EXPECT_EQ(receipts.size(), 6u) << "every delivery has its own receipt";
  for (const Delivery& d : got) EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
  ExpectDrained();
  // An ack is not repeatable: the message is gone.
  EXPECT_EQ(source().Ack(got[0]).code(), Code::kLeaseLost);
}

TEST_P(DeliverySuite, MessagePublishedTwiceIsDeliveredTwiceWithTheSameId) {
  Message m = Msg("order-42", "4000");
  PublishTwice(m);
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.id, "order-42");
    EXPECT_EQ(d.message.payload, "4000");
    EXPECT_EQ(d.message.attempt, 1);
  }
  EXPECT_NE(got[0].receipt, got[1].receipt);
  // The copies are independent: acking one leaves the other leased.
  ASSERT_TRUE(source().Ack(got[0]).ok());
  Advance(kLeaseMs + 1);
  std::vector<Delivery> again = ReceiveAll();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].message.id, "order-42");
  EXPECT_EQ(again[0].message.attempt, 2);
  ASSERT_TRUE(source().Ack(again[0]).ok());
  ExpectDrained();
}

TEST_P(DeliverySuite, LeasedMessageIsInvisibleUntilTheLeaseExpiresThenRedelivered) {
  PublishTwice(Msg("m-1"));
  auto first = source().Receive(1, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 1u);
  EXPECT_EQ((*first)[0].message.attempt, 1);
  // The second receiver sees only the other copy, never the leased one.
  std::vector<Delivery> second = ReceiveAll();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].message.attempt, 1);
  EXPECT_NE(second[0].receipt, (*first)[0].receipt);
  EXPECT_TRUE(ReceiveAll().empty());
  // A Receive that waits less than the lease still sees nothing.
  auto waited = source().Receive(10, kLeaseMs / 2);
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_TRUE(waited->empty());
  Advance(kLeaseMs);  // now past both leases
  std::vector<Delivery> redelivered = ReceiveAll();
  ASSERT_EQ(redelivered.size(), 2u);
  for (const Delivery& d : redelivered) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.attempt, 2);
  }
  for (const Delivery& d : redelivered) EXPECT_TRUE(source().Ack(d).ok());
  ExpectDrained();
}

TEST_P(DeliverySuite, AWaitingReceiveSeesALeaseExpire) {
  PublishTwice(Msg("m-1"));
  ASSERT_EQ(ReceiveAll().size(), 2u);
  // Receive waits longer than the lease: the messages come back within it.
  auto got = source().Receive(10, kLeaseMs * 2);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  for (const Delivery& d : *got) {
    EXPECT_EQ(d.message.attempt, 2);
    EXPECT_TRUE(source().Ack(d).ok());
  }
  ExpectDrained();
}

TEST_P(DeliverySuite, StaleReceiptAfterRedeliveryIsLeaseLostAndDeletesNothing) {
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
    EXPECT_EQ(d.message.attempt, 2);
    EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
  }
  ExpectDrained();
}

TEST_P(DeliverySuite, StaleReceiptAfterNackAndRedeliveryIsLeaseLost) {
  PublishTwice(Msg("m-1"));
  std::vector<Delivery> first = ReceiveAll();
  ASSERT_EQ(first.size(), 2u);
  for (const Delivery& d : first) ASSERT_TRUE(source().Nack(d, 0).ok());
  std::vector<Delivery> second = ReceiveAll();
  ASSERT_EQ(second.size(), 2u);
  for (const Delivery& d : first) EXPECT_EQ(source().Ack(d).code(), Code::kLeaseLost);
  for (const Delivery& d : second) {
    EXPECT_EQ(d.message.attempt, 2);
    EXPECT_TRUE(source().Ack(d).ok());
  }
  ExpectDrained();
}

// A handler that runs longer than the lease keeps its delivery by extending
// the lease (the Consumer does so every third of lease_ms()). A source
// without leases (lease_ms() == 0) answers OK and holds the delivery anyway.
TEST_P(DeliverySuite, ADeliveryWhoseLeaseIsExtendedIsNotRedeliveredMeanwhile) {
  PublishTwice(Msg("m-1"));
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 2u);
  const int64_t lease = source().lease_ms();
  EXPECT_TRUE(lease == kLeaseMs || lease == 0) << "lease_ms() is " << lease << ", the source was opened with " << kLeaseMs;
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
    EXPECT_EQ(d.message.attempt, 1);
    Status s = source().Ack(d);
    EXPECT_TRUE(s.ok()) << s;
  }
  ExpectDrained();
}

// An extension cannot bring back a lease that was lost: once the delivery
// expired and was received again, or was acked, ExtendLease of the old
// receipt is kLeaseLost and leaves the new delivery alone.
TEST_P(DeliverySuite, ExtendLeaseAfterTheLeaseWasLostIsLeaseLost) {
  auto [stale, fresh] = ReceiveAcrossALeaseExpiry(Msg("m-1"));
  ASSERT_EQ(stale.size(), 2u);
  if (source().lease_ms() == 0) {
    // No lease to lose: the deliveries stay ours however long it takes.
    EXPECT_TRUE(fresh.empty());
    for (const Delivery& d : stale) {
      EXPECT_TRUE(source().ExtendLease(d).ok());
      EXPECT_TRUE(source().Ack(d).ok());
    }
    ExpectDrained();
    return;
  }
  ASSERT_EQ(fresh.size(), 2u);
  for (const Delivery& d : stale) {
    Status s = source().ExtendLease(d);
    EXPECT_EQ(s.code(), Code::kLeaseLost) << s;
  }
  // The new deliveries kept their leases: invisible, extendable, ackable.
  EXPECT_TRUE(ReceiveAll().empty());
  for (const Delivery& d : fresh) {
    EXPECT_EQ(d.message.attempt, 2);
    EXPECT_TRUE(source().ExtendLease(d).ok()) << d.receipt;
    EXPECT_TRUE(source().Ack(d).ok()) << d.receipt;
    Status s = source().ExtendLease(d);
    EXPECT_EQ(s.code(), Code::kLeaseLost) << "after the ack: " << s;
  }
  ExpectDrained();
}

TEST_P(DeliverySuite, NackWithDelayHidesTheMessageUntilTheDelayPasses) {
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
    EXPECT_EQ(d.message.attempt, 2);
  }
  // Nack without delay: visible again at once.
  for (const Delivery& d : back) ASSERT_TRUE(source().Nack(d, 0).ok());
  std::vector<Delivery> third = ReceiveAll();
  ASSERT_EQ(third.size(), 2u);
  for (const Delivery& d : third) {
    EXPECT_EQ(d.message.attempt, 3);
    EXPECT_TRUE(source().Ack(d).ok());
  }
  ExpectDrained();
}

TEST_P(DeliverySuite, HeadersProducerTimeAndBinaryPayloadsRoundTripByteExact) {
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

TEST_P(DeliverySuite, ReceiveReturnsAtMostMax) {
  for (int i = 0; i < 5; ++i) PublishTwice(Msg("m-" + std::to_string(i)));
  std::vector<Delivery> all;
  for (int round = 0; round < 20 && all.size() < 10; ++round) {
    auto got = source().Receive(3, 0);
    ASSERT_TRUE(got.ok()) << got.status();
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

TEST_P(DeliverySuite, ConcurrentReceiversGetEachDeliveryExactlyOnceAndLoseNothing) {
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
        if (d.message.attempt != 1) ++ack_errors;  // a second lease while the first was valid
        if (source().Ack(d).ok()) ++acked;
        else ++ack_errors;
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

TEST_P(DeliverySuite, TwoProcessesConsumingOneQueueAckEveryDeliveryExactlyOnce) {
  constexpr int kIds = 120;
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < kIds; ++i) Publish(Msg("m-" + std::to_string(i)));
  handle_ = {};  // no connection crosses the fork
  auto child = [&](int n) -> int {
    // The real clock and a lease far longer than the test: a second delivery
    // here would be a double lease, not an expiry.
    auto h = GetParam().open(dir_, {.lease_ms = 600'000, .env = Env::Default()});
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
        if (d.message.attempt != 1) return 5;
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
  auto h = GetParam().open(dir_, {.lease_ms = kLeaseMs, .env = &env_});
  ASSERT_TRUE(h.ok()) << h.status();
  handle_ = std::move(*h);
  ExpectDrained();
}

}  // namespace
}  // namespace idem::testing
