// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// IdFrom (idem/id_from.h): ids from a JSON pointer into the payload, from a
// header, composite; bad specs refused by name; and under a Consumer on the
// in-memory source: two deliveries whose source ids differ but whose
// payloads carry one order id apply once; one without it is dead-lettered
// at once and acknowledged.
#include <gtest/gtest.h>

#include "idem/consumer.h"
#include "idem/id_from.h"
#include "idem/testing/gtest.h"
#include "idem/testing/memory_source.h"
#include "idem/testing/throwaway.h"
#include "util/test_util.h"

namespace idem {
namespace {

using testing::ChargeHandler;
using testing::Charges;
using testing::CreatePayments;
using testing::Msg;

TEST(IdFrom, ReadsAJsonPointerAHeaderAndACompositeOfThem) {
  Message m = Msg("source-7", R"({"order":{"id":"1042","lines":[{"sku":"A-1"}]},"n":7,"a/b":"slash","t~":"tilde"})");
  m.headers.emplace_back("X-Tenant", "acme");
  auto expect = [&](const char* spec, const char* want) {
    auto f = IdFrom::Parse(spec);
    ASSERT_OK(f);
    auto id = f->Extract(m);
    ASSERT_OK(id);
    EXPECT_EQ(*id, want) << spec;
  };
  expect("json:/order/id", "1042");
  expect("json:/order/lines/0/sku", "A-1");
  expect("json:/n", "7");
  expect("json:/a~1b", "slash");
  expect("json:/t~0", "tilde");
  expect("header:x-tenant", "acme");
  expect("header:X-Tenant+json:/order/id", "acme:1042");
  // A composite's values are escaped: different values, different ids.
  Message a = Msg("m", R"({"x":"a:b","y":"c","z":"a\\"})"), b = Msg("m", R"({"x":"a","y":"b:c"})");
  auto xy = IdFrom::Parse("json:/x+json:/y");
  ASSERT_OK(xy);
  EXPECT_EQ(xy->Extract(a).value(), "a\\:b:c");
  EXPECT_EQ(xy->Extract(b).value(), "a:b\\:c");
  EXPECT_EQ(IdFrom::Parse("json:/z+json:/y")->Extract(a).value(), "a\\\\:c");
  EXPECT_EQ(IdFrom::Parse("json:/x")->Extract(a).value(), "a:b");  // one part: as it is
}

TEST(IdFrom, AMessageWithoutItIsRejectedNamingWhatIsMissing) {
  auto f = IdFrom::Parse("json:/order/id");
  ASSERT_OK(f);
  for (auto [payload, why] :
       {std::pair{"not json", "not JSON"}, std::pair{R"({"order":{}})", "has no /order/id"},
        std::pair{R"({"order":{"id":null}})", "is null, not a string"}, std::pair{R"({"order":{"id":""}})", "is empty"},
        std::pair{R"({"order":[1]})", "has no /order/id"}}) {
    auto id = f->Extract(Msg("m", payload));
    EXPECT_TRUE(id.status().IsRejected()) << payload;
    EXPECT_NE(id.status().message().find(why), std::string::npos) << id.status();
  }
  auto h = IdFrom::Parse("header:X-Order-Id");
  EXPECT_NE(h->Extract(Msg("m", "{}")).status().message().find("no X-Order-Id header"), std::string::npos);
  auto long_id = f->Extract(Msg("m", R"({"order":{"id":")" + std::string(300, 'x') + R"("}})"));
  EXPECT_TRUE(long_id.status().IsInvalidArgument()) << long_id.status();
}

TEST(IdFrom, ABadSpecIsRefusedByName) {
  for (auto [spec, why] :
       {std::pair{"", "empty"}, std::pair{"json:order/id", "must start with '/'"},
        std::pair{"json:/a~2", "'~' not followed by 0 or 1"}, std::pair{"header:", "needs a header name"},
        std::pair{"xpath://id", "neither json:/pointer nor header:Name"},
        std::pair{"json:/a+", "neither json:/pointer"}}) {
    auto f = IdFrom::Parse(spec);
    EXPECT_TRUE(f.status().IsInvalidArgument()) << spec;
    EXPECT_NE(f.status().message().find(why), std::string::npos) << f.status();
  }
}

TEST(IdFrom, UnderAConsumerOneBusinessKeyAppliesOnceAndAMessageWithoutOneIsDeadLettered) {
  auto db = testing::TempSqlite::Open();
  ASSERT_OK(db);
  Store& store = (*db)->store();
  ASSERT_OK(CreatePayments(store));
  auto inbox = Inbox::Open(store, {.consumer = "orders"});
  ASSERT_OK(inbox);
  testing::MemorySource source({.lease_ms = 0});
  // A producer that retried: two source ids, one order; each delivered twice.
  for (int copy = 0; copy < 2; ++copy) {
    source.Push(Msg("redis-1-" + std::to_string(copy), R"({"order":{"id":"1042"},"cents":4000})"));
    source.Push(Msg("redis-2-" + std::to_string(copy), R"({"order":{"id":"1043"},"cents":100})"));
    source.Push(Msg("redis-3-" + std::to_string(copy), R"({"cents":5})"));
  }
  auto consumer = Consumer::Open(source, **inbox, ChargeHandler(),
                                 {.stop_when_idle = true, .id_from = IdFrom::Parse("json:/order/id").value()});
  ASSERT_OK(consumer);
  ASSERT_OK((*consumer)->Run());
  EXPECT_EQ(source.pending(), 0);  // everything acknowledged, the dead letters too
  EXPECT_EQ(Charges(store), 2);
  EXPECT_EQ(Charges(store, "1042"), 1);
  EXPECT_EQ(Charges(store, "1043"), 1);
  auto letters = store.ListDeadLetters("orders", 10);
  ASSERT_OK(letters);
  ASSERT_EQ(letters->size(), 2u);
  EXPECT_EQ((*letters)[0].reason, "rejected");
  EXPECT_NE((*letters)[0].error.find("has no /order/id"), std::string::npos) << (*letters)[0].error;
  EXPECT_EQ((*consumer)->stats().rejected, 2u);
}

}  // namespace
}  // namespace idem
