// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::kafka without a cluster: the one error translation function,
// receipts, and the checks made before anything is polled.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <stdexcept>

#include "idem/kafka/offset_inbox.h"
#include "idem/kafka/source.h"
#include "idem/sqlite/store.h"
#include "kafka/errors.h"
#include "util/test_util.h"

namespace idem::kafka {
namespace {

TEST(KafkaErrors, EachErrorMapsToTheCodeACallerBranchesOn) {
  struct Case {
    rd_kafka_resp_err_t err;
    Code code;
  };
  const Case cases[] = {
      {RD_KAFKA_RESP_ERR_NO_ERROR, Code::kOk},
      {RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS, Code::kLeaseLost},
      {RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION, Code::kLeaseLost},
      {RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID, Code::kLeaseLost},
      {RD_KAFKA_RESP_ERR__ASSIGNMENT_LOST, Code::kLeaseLost},
      {RD_KAFKA_RESP_ERR__TRANSPORT, Code::kUnavailable},
      {RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, Code::kUnavailable},
      {RD_KAFKA_RESP_ERR__TIMED_OUT, Code::kUnavailable},
      {RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, Code::kUnavailable},
      {RD_KAFKA_RESP_ERR_NOT_COORDINATOR, Code::kUnavailable},
      {RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE, Code::kUnavailable},
      {RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, Code::kUnavailable},
      {RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE, Code::kUnavailable},
      {RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, Code::kInvalidArgument},
      {RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC, Code::kInvalidArgument},
      {RD_KAFKA_RESP_ERR__INVALID_ARG, Code::kInvalidArgument},
      {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, Code::kInvalidArgument},
      {RD_KAFKA_RESP_ERR__QUEUE_FULL, Code::kBusy},
      {RD_KAFKA_RESP_ERR__DESTROY, Code::kAborted},
      {RD_KAFKA_RESP_ERR__NO_OFFSET, Code::kNotFound},
      {RD_KAFKA_RESP_ERR__FATAL, Code::kInternal},
  };
  for (const Case& c : cases) {
    Status s = kafka_internal::Translate(c.err, "ctx");
    EXPECT_EQ(s.code(), c.code) << rd_kafka_err2name(c.err) << " -> " << s;
    if (!s.ok()) {
      EXPECT_NE(s.message().find("kafka: ctx: "), std::string::npos) << s;
      EXPECT_NE(s.message().find(rd_kafka_err2name(c.err)), std::string::npos) << s;
    }
  }
}

TEST(KafkaReceipt, RoundTripsWithAnyTopicName) {
  for (const std::string topic : {"payments", "a:b:c", "t.with-dots_and_underscores"}) {
    Receipt r{topic, 7, 123456789012345, 42};
    auto d = DecodeReceipt(EncodeReceipt(r));
    ASSERT_OK(d);
    EXPECT_EQ(d->topic, topic);
    EXPECT_EQ(d->partition, 7);
    EXPECT_EQ(d->offset, 123456789012345);
    EXPECT_EQ(d->assignment, 42u);
  }
}

TEST(KafkaReceipt, RejectsForeignReceipts) {
  for (const char* bad : {"", "kafka:", "kafka:1:2:3", "kafka:1:2:3:", "kafka:x:2:3:t", "kafka:1:-2:3:t",
                          "redis:1:2:3:t", "kafka:1:99999999999:3:t"}) {
    auto d = DecodeReceipt(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(KafkaOptions, MissingRequiredOptionsAreRefused) {
  EXPECT_EQ(Source::Open({.topic = "t", .group = "g"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Source::Open({.brokers = "127.0.0.1:1", .group = "g"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Source::Open({.brokers = "127.0.0.1:1", .topic = "t"}).status().code(), Code::kInvalidArgument);
  auto bad_conf =
      Source::Open({.brokers = "127.0.0.1:1", .topic = "t", .group = "g", .config = {{"no.such.property", "1"}}});
  ASSERT_FALSE(bad_conf.ok());
  EXPECT_EQ(bad_conf.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad_conf.status().message().find("no.such.property"), std::string::npos) << bad_conf.status();
  EXPECT_EQ(Publisher::Open({.topic = "t"}).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace idem::kafka

namespace idem::testing {
namespace {

// The offset mode without a cluster: a delivery only needs a Kafka receipt.
// As every source (idem/source.h): Receive returns up to `max`, so a max
// below 1 is the caller's mistake, refused before anything is polled. (The
// brokers are contacted lazily: none is needed to see it.)
TEST(KafkaSource, ReceiveOfNoneIsInvalidArgument) {
  auto src = kafka::Source::Open({.brokers = "127.0.0.1:1", .topic = "t", .group = "g"});
  ASSERT_OK(src);
  for (int max : {0, -1}) {
    auto got = (*src)->Receive(max, 0);
    EXPECT_EQ(got.status().code(), Code::kInvalidArgument) << max;
    EXPECT_NE(got.status().message().find("max"), std::string::npos) << got.status();
  }
  EXPECT_EQ((*src)->stats().delivered, 0u);
}

TEST(KafkaOffsetInbox, AThrowingHandlerIsAFailureStoresNothingAndTheRetryApplies) {
  TempDir dir;
  auto store = sqlite::Store::Open({.path = dir.File("store.db")});
  ASSERT_OK(store);
  auto oi = kafka::OffsetInbox::Open(**store, {.consumer = "billing"});
  ASSERT_OK(oi);
  Delivery d;
  d.message = Msg("m-5");
  d.receipt = "kafka:1:0:5:payments";
  Outcome thrown = (*oi)->Handle(d, [](Transaction&, const Message&) -> Status { throw std::runtime_error("boom"); });
  EXPECT_EQ(thrown.kind, Outcome::Kind::kFailed);
  EXPECT_EQ(thrown.status.code(), Code::kHandlerFailed);
  EXPECT_NE(thrown.status.message().find("handler threw: boom"), std::string::npos) << thrown.status;
  auto last = (*oi)->LastApplied("payments", 0);
  ASSERT_TRUE(last.ok());
  EXPECT_FALSE(last->has_value()) << "nothing stored by a failed handler";
  int runs = 0;
  auto ok = [&](Transaction&, const Message&) -> Status {
    ++runs;
    return Status::OK();
  };
  for (int delivery = 0; delivery < 2; ++delivery) {
    Outcome o = (*oi)->Handle(d, ok);
    EXPECT_EQ(o.kind, delivery == 0 ? Outcome::Kind::kApplied : Outcome::Kind::kDuplicate) << o.ToString();
  }
  EXPECT_EQ(runs, 1);
  last = (*oi)->LastApplied("payments", 0);
  ASSERT_TRUE(last.ok() && last->has_value());
  EXPECT_EQ(**last, 5);
}

}  // namespace
}  // namespace idem::testing
