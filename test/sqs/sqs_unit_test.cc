// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::sqs without a server: the URL, the options Open checks before any
// call, the wire format (body and message attributes) both ways, and the
// table of SQS errors.
#include <gtest/gtest.h>

#include <string>

#include "idem/sqs/source.h"
#include "sqs/common.h"
#include "util/test_util.h"

namespace idem::sqs {
namespace {

using nlohmann::json;
using testing::Msg;

TEST(SqsUrlTest, ParsesTheQueueTheConnectionAndTheSourceKeys) {
  auto o = Source::ParseUrl(
      "sqs://orders.fifo?region=eu-west-1&endpoint=http://127.0.0.1:4566&profile=prod&lease_ms=60000"
      "&id_attribute=my-id&message_id_fallback=false&max_attempts=3&pool_size=4&create_queue=true");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->queue, "orders.fifo");
  EXPECT_EQ(o->connect.region, "eu-west-1");
  EXPECT_EQ(o->connect.endpoint, "http://127.0.0.1:4566");
  EXPECT_EQ(o->connect.profile, "prod");
  EXPECT_EQ(o->lease_ms, 60'000);
  EXPECT_EQ(o->id_attribute, "my-id");
  EXPECT_FALSE(o->message_id_fallback);
  EXPECT_EQ(o->connect.max_attempts, 3);
  EXPECT_EQ(o->connect.pool_size, 4);
  EXPECT_TRUE(o->create_queue);
  auto p = Publisher::ParseUrl("sqs://orders.fifo?group_id=g-1&deduplicate_by_id=false&lease_ms=60000");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->queue, "orders.fifo");
  EXPECT_EQ(p->group_id, "g-1");
  EXPECT_FALSE(p->deduplicate_by_id);
}

TEST(SqsUrlTest, TakesAQueueUrl) {
  auto o =
      Source::ParseUrl("sqs://?queue_url=https://sqs.eu-west-1.amazonaws.com/123456789012/orders&region=eu-west-1");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->queue, "https://sqs.eu-west-1.amazonaws.com/123456789012/orders");
}

TEST(SqsUrlTest, RefusesWhatItCannotUse) {
  for (const char* bad :
       {"redis://q", "sqs://", "sqs://q?lease_ms=500", "sqs://q?lease_ms=abc", "sqs://q?nope=1",
        "sqs://q?queue_url=https://x/1/q", "sqs://?queue_url=ftp://x/q", "sqs://q?create_queue=maybe"}) {
    auto o = Source::ParseUrl(bad);
    EXPECT_EQ(o.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(SqsOptionsTest, OpenChecksTheOptionsBeforeAnyCall) {
  auto no_queue = Source::Open({});
  EXPECT_EQ(no_queue.status().code(), Code::kInvalidArgument);
  Source::Options o{.queue = "q", .lease_ms = 1'500};
  o.connect.region = "us-east-1";
  o.connect.access_key_id = "AKID";
  o.connect.secret_access_key = "secret";
  EXPECT_EQ(Source::Open(o).status().code(), Code::kInvalidArgument) << "not whole seconds";
  o.lease_ms = 0;
  EXPECT_EQ(Source::Open(o).status().code(), Code::kInvalidArgument);
  o.lease_ms = 44'000'000;
  EXPECT_EQ(Source::Open(o).status().code(), Code::kInvalidArgument) << "above 12 hours";
}

TEST(SqsWireTest, TextIsWhatSqsCarries) {
  EXPECT_TRUE(sqs_internal::IsSqsText("plain ascii\ttab\nnewline"));
  EXPECT_TRUE(sqs_internal::IsSqsText("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(sqs_internal::IsSqsText(std::string("nul\0", 4)));
  EXPECT_FALSE(sqs_internal::IsSqsText("\x01"));
  EXPECT_FALSE(sqs_internal::IsSqsText("\xff"));
  EXPECT_FALSE(sqs_internal::IsSqsText("\xc0\xaf"));      // overlong
  EXPECT_FALSE(sqs_internal::IsSqsText("\xed\xa0\x80"));  // a surrogate
  EXPECT_FALSE(sqs_internal::IsSqsText("\xef\xbf\xbe"));  // U+FFFE
  EXPECT_FALSE(sqs_internal::IsSqsText("\xe2\x82"));      // cut short
}

// What SendMessage gets, turned into what ReceiveMessage answers.
Message RoundTrip(const Message& m, const sqs_internal::EncodeOptions& eo, json* sent = nullptr) {
  auto e = sqs_internal::EncodeMessage(m, eo);
  EXPECT_TRUE(e.ok()) << e.status();
  if (sent) *sent = *e;
  json received = {{"MessageId", "sqs-1"},
                   {"ReceiptHandle", "rh"},
                   {"Body", (*e)["MessageBody"]},
                   {"MessageAttributes", (*e)["MessageAttributes"]},
                   {"Attributes", {{"ApproximateReceiveCount", "3"}}}};
  return sqs_internal::DecodeMessage(received, eo.id_attribute, true);
}

TEST(SqsWireTest, EveryMessageRoundTripsByteExact) {
  Message m;
  m.id = std::string("m\0\xff", 3);
  m.payload = std::string("\0\x01\xfe", 3);
  m.producer_time_ms = 1'712'345'678'901;
  m.headers = {{"", "empty name"}, {"b", std::string("\0", 1)}, {"b", "again"}};
  json sent;
  Message got = RoundTrip(m, {.id_attribute = "idem-id"}, &sent);
  EXPECT_EQ(got.id, m.id);
  EXPECT_EQ(got.payload, m.payload);
  EXPECT_EQ(got.producer_time_ms, m.producer_time_ms);
  EXPECT_EQ(got.headers, m.headers);
  EXPECT_EQ(got.attempt, 3);
  EXPECT_EQ(sent["MessageAttributes"]["idem-id"]["DataType"], "Binary");
  EXPECT_EQ(sent["MessageAttributes"]["idem-body"]["StringValue"], "base64");
  EXPECT_FALSE(sent.contains("MessageGroupId")) << "a standard queue";

  Message text = Msg("order-1", "{\"amount\": 5}");
  got = RoundTrip(text, {.id_attribute = "idem-id"}, &sent);
  EXPECT_EQ(sent["MessageBody"], "{\"amount\": 5}") << "text goes as it is";
  EXPECT_EQ(sent["MessageAttributes"]["idem-id"]["StringValue"], "order-1");
  EXPECT_FALSE(sent["MessageAttributes"].contains("idem-body"));
  EXPECT_EQ(got.id, "order-1");
  EXPECT_TRUE(got.headers.empty());

  Message empty = Msg("e-1", "");
  got = RoundTrip(empty, {.id_attribute = "idem-id"}, &sent);
  EXPECT_FALSE(sent["MessageBody"].get<std::string>().empty()) << "SQS refuses an empty body";
  EXPECT_EQ(got.payload, "");
}

TEST(SqsWireTest, FifoGetsADeduplicationIdFromTheMessageIdAndAGroup) {
  json sent;
  Message m = Msg("order-1");
  RoundTrip(m, {.id_attribute = "idem-id", .fifo = true, .key = "customer-7"}, &sent);
  EXPECT_EQ(sent["MessageDeduplicationId"], "order-1");
  EXPECT_EQ(sent["MessageGroupId"], "customer-7");
  RoundTrip(m, {.id_attribute = "idem-id", .fifo = true, .group_id = "all"}, &sent);
  EXPECT_EQ(sent["MessageGroupId"], "all");
  m.headers = {{std::string(kOrderingKeyHeader), "from-header"}};
  RoundTrip(m, {.id_attribute = "idem-id", .fifo = true, .group_id = "all"}, &sent);
  EXPECT_EQ(sent["MessageGroupId"], "from-header");
  Message binary = Msg(std::string("a b\x01", 4));
  RoundTrip(binary, {.id_attribute = "idem-id", .fifo = true}, &sent);
  EXPECT_EQ(sent["MessageDeduplicationId"].get<std::string>().rfind("sha256~", 0), 0u);
  json again;
  RoundTrip(binary, {.id_attribute = "idem-id", .fifo = true}, &again);
  EXPECT_EQ(sent["MessageDeduplicationId"], again["MessageDeduplicationId"]);
  EXPECT_NE(sent["MessageGroupId"], again["MessageGroupId"]) << "no key, no group_id: a group per message";
  RoundTrip(m, {.id_attribute = "idem-id", .fifo = true, .deduplicate_by_id = false}, &sent);
  RoundTrip(m, {.id_attribute = "idem-id", .fifo = true, .deduplicate_by_id = false}, &again);
  EXPECT_NE(sent["MessageDeduplicationId"], again["MessageDeduplicationId"]);
  EXPECT_EQ(sqs_internal::EncodeMessage(Msg(""), {.id_attribute = "idem-id"}).status().code(), Code::kInvalidArgument);
}

TEST(SqsWireTest, AForeignMessageKeepsItsAttributesAsHeaders) {
  json received = {{"MessageId", "sqs-42"},
                   {"Body", "hello"},
                   {"MessageAttributes",
                    {{"tenant", {{"DataType", "String"}, {"StringValue", "acme"}}},
                     {"blob", {{"DataType", "Binary"}, {"BinaryValue", "AAE="}}},
                     {"idem-producer-time-ms", {{"DataType", "Number"}, {"StringValue", "17"}}}}},
                   {"Attributes", {{"ApproximateReceiveCount", "1"}}}};
  Message m = sqs_internal::DecodeMessage(received, "idem-id", true);
  EXPECT_EQ(m.id, "sqs-42");
  EXPECT_EQ(m.payload, "hello");
  EXPECT_EQ(m.producer_time_ms, 17);
  EXPECT_EQ(m.Header("tenant"), std::optional<std::string_view>("acme"));
  EXPECT_EQ(m.Header("blob"), std::optional<std::string_view>(std::string("\0\x01", 2)));
  Message strict = sqs_internal::DecodeMessage(received, "idem-id", false);
  EXPECT_TRUE(strict.id.empty());
  ASSERT_TRUE(strict.Header("idem-error").has_value());
}

TEST(SqsErrorTest, TheTable) {
  using aws_internal::ServiceError;
  auto code = [](ServiceError e, bool receipt) { return sqs_internal::ErrorStatus(e, "call", receipt).code(); };
  EXPECT_EQ(code({400, "ReceiptHandleIsInvalid", "", {}}, true), Code::kLeaseLost);
  EXPECT_EQ(code({400, "MessageNotInflight", "", {}}, true), Code::kLeaseLost);
  EXPECT_EQ(
      code({400, "InvalidParameterValue", "Value x for parameter ReceiptHandle is invalid. Reason: expired", {}}, true),
      Code::kLeaseLost);
  EXPECT_EQ(code({400, "InvalidParameterValue", "VisibilityTimeout too large", {}}, true), Code::kInvalidArgument);
  EXPECT_EQ(code({400, "ReceiptHandleIsInvalid", "", {}}, false), Code::kInvalidArgument);
  EXPECT_EQ(code({400, "QueueDoesNotExist", "", {}}, false), Code::kNotFound);
  EXPECT_EQ(code({400, "ThrottlingException", "", {}}, false), Code::kBusy);
  EXPECT_EQ(code({400, "RequestThrottled", "", {}}, true), Code::kBusy);
  EXPECT_EQ(code({500, "InternalError", "", {}}, true), Code::kUnavailable);
  EXPECT_EQ(code({403, "InvalidClientTokenId", "", {}}, false), Code::kInvalidArgument);
}

TEST(SqsErrorTest, ABatchAnswerGivesEachEntryItsOwnStatus) {
  json answer = {{"Successful", {{{"Id", "0"}}, {{"Id", "2"}}}},
                 {"Failed",
                  {{{"Id", "1"}, {"Code", "ReceiptHandleIsInvalid"}, {"SenderFault", true}},
                   {{"Id", "3"}, {"Code", "InternalError"}, {"SenderFault", false}},
                   {{"Id", "99"}, {"Code", "Nonsense"}}}}};
  std::vector<Status> st = sqs_internal::BatchStatuses(answer, 5, "DeleteMessageBatch", [](const auto& e) {
    return sqs_internal::ErrorStatus(e, "DeleteMessageBatch", true);
  });
  ASSERT_EQ(st.size(), 5u);
  EXPECT_TRUE(st[0].ok());
  EXPECT_EQ(st[1].code(), Code::kLeaseLost);
  EXPECT_TRUE(st[2].ok());
  EXPECT_EQ(st[3].code(), Code::kUnavailable);
  EXPECT_EQ(st[4].code(), Code::kInDoubt) << "named nowhere in the answer";
}

TEST(SqsWireTest, SecondsRoundUpAndClamp) {
  EXPECT_EQ(sqs_internal::Seconds(0, 20), 0);
  EXPECT_EQ(sqs_internal::Seconds(1, 20), 1);
  EXPECT_EQ(sqs_internal::Seconds(1'000, 20), 1);
  EXPECT_EQ(sqs_internal::Seconds(1'001, 20), 2);
  EXPECT_EQ(sqs_internal::Seconds(60'000, 20), 20);
  EXPECT_EQ(sqs_internal::Seconds(-5, 20), 0);
}

}  // namespace
}  // namespace idem::sqs
