// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Trace context (idem/trace.h): the traceparent of a message is the handler's
// current trace, Outbox::Add writes it into what the handler adds, the relay
// carries it to the next broker, and the next consumer's handler continues
// the same trace. Every message is delivered twice.
#include "idem/trace.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "idem/outbox.h"
#include "idem/outbox_relay.h"
#include "idem/sqlite/store.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

constexpr char kTrace[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
constexpr char kOtherTrace[] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

TEST(Trace, TraceparentsAreCheckedAsW3CSaysAndMalformedOnesAreNotPassedOn) {
  EXPECT_TRUE(IsValidTraceparent(kTrace));
  EXPECT_TRUE(IsValidTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
  // A later version may carry more fields after a '-'.
  EXPECT_TRUE(IsValidTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes"));
  EXPECT_TRUE(IsValidTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
  for (const char* bad : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  // version 00 has no more fields
           "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",   // a later one adds them after '-'
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // version ff is invalid
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // all-zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // all-zero parent id
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // upper case
           "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",    // a dash misplaced
           "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
       })
    EXPECT_FALSE(IsValidTraceparent(bad)) << bad;

  Message m{.id = "m-1"};
  m.headers = {{"traceparent", "00-nonsense"}, {"tracestate", "congo=t61rcWkgMzE"}};
  EXPECT_TRUE(TraceContext::Of(m).empty());
  m.headers = {{"traceparent", kTrace}, {"tracestate", "congo=t61rcWkgMzE"}};
  EXPECT_EQ(TraceContext::Of(m).traceparent, kTrace);
  EXPECT_EQ(TraceContext::Of(m).tracestate, "congo=t61rcWkgMzE");
  m.headers = {{"traceparent", kTrace}, {"tracestate", std::string(513, 'a')}};  // over 512 bytes: dropped
  EXPECT_EQ(TraceContext::Of(m).traceparent, kTrace);
  EXPECT_EQ(TraceContext::Of(m).tracestate, "");
}

TEST(Trace, ScopesNestAndRestoreWhatWasThere) {
  EXPECT_EQ(CurrentTrace(), nullptr);
  {
    TraceScope outer({.traceparent = kTrace});
    ASSERT_NE(CurrentTrace(), nullptr);
    EXPECT_EQ(CurrentTrace()->traceparent, kTrace);
    {
      TraceScope none({});
      EXPECT_EQ(CurrentTrace(), nullptr);
      TraceScope inner({.traceparent = kOtherTrace, .tracestate = "a=b"});
      EXPECT_EQ(CurrentTrace()->traceparent, kOtherTrace);
      EXPECT_EQ(CurrentTrace()->tracestate, "a=b");
    }
    EXPECT_EQ(CurrentTrace()->traceparent, kTrace);
  }
  EXPECT_EQ(CurrentTrace(), nullptr);
}

std::unique_ptr<Store> OpenStore(const TempDir& dir, const std::string& name) {
  auto s = sqlite::Store::Open({.path = dir.File(name)});
  EXPECT_OK(s);
  return s.ok() ? std::move(*s) : nullptr;
}

// The queue named `name` in file `name`.db (an outbox destination names the queue).
std::unique_ptr<embedded::Queue> OpenQueue(const TempDir& dir, const std::string& name) {
  auto q = embedded::Queue::Open({.path = dir.File(name + ".db"), .queue = name, .durable = false});
  EXPECT_OK(q);
  return q.ok() ? std::move(*q) : nullptr;
}

// Stage 1 (payments) applies each order and adds "order paid" to its outbox;
// the relay publishes it; stage 2 (shipping) applies it. Each handler records
// the trace it ran under, per message id.
TEST(Trace, OneTraceFollowsAMessageThroughTheInboxTheOutboxTheRelayAndTheNextConsumer) {
  TempDir dir;
  auto payments_store = OpenStore(dir, "payments.db");
  auto shipping_store = OpenStore(dir, "shipping.db");
  auto orders = OpenQueue(dir, "orders");
  auto paid = OpenQueue(dir, "paid");
  ASSERT_TRUE(payments_store && shipping_store && orders && paid);

  // Every order twice: with a trace, with a malformed one, with none.
  const std::map<std::string, std::string> traces = {
      {"order-1", kTrace}, {"order-2", "00-not-a-trace"}, {"order-3", ""}};
  for (int copy = 0; copy < 2; ++copy) {
    for (const auto& [id, tp] : traces) {
      Message m{.id = id, .payload = "4000"};
      if (!tp.empty()) m.headers = {{"traceparent", tp}, {"tracestate", "vendor=x1"}};
      ASSERT_TRUE(orders->Publish(m).ok());
    }
  }

  std::mutex mu;
  std::map<std::string, std::vector<std::string>> seen;  // "stage/id" -> traces seen
  auto record = [&](const std::string& where) {
    const TraceContext* t = CurrentTrace();
    std::lock_guard lock(mu);
    seen[where].push_back(t == nullptr ? "none" : t->traceparent + "|" + t->tracestate);
  };

  auto outbox = Outbox::Open(*payments_store);
  ASSERT_OK(outbox);
  auto payments = Inbox::Open(*payments_store, {.consumer = "payments"});
  ASSERT_OK(payments);
  const Handler charge = [&](Transaction& tx, const Message& m) -> Status {
    record("payments/" + m.id);
    IDEM_RETURN_IF_ERROR(
        (*outbox)->Add(tx, {.destination = "paid", .id = "paid-" + m.id, .key = m.id, .payload = "paid"}).status());
    // A message that names its own trace keeps it.
    OutgoingMessage own{.destination = "paid", .id = "audit-" + m.id, .key = m.id, .payload = "audit"};
    own.headers = {{"traceparent", kOtherTrace}};
    return (*outbox)->Add(tx, own).status();
  };
  auto stage1 = Consumer::Open(*orders, **payments, charge, {.stop_when_idle = true});
  ASSERT_OK(stage1);
  ASSERT_OK((*stage1)->Run());
  EXPECT_EQ(CurrentTrace(), nullptr);  // nothing left behind on this thread

  auto relay = OutboxRelay::Open(*payments_store, *paid, {.poll_ms = 10, .stop_when_idle = true});
  ASSERT_OK(relay);
  ASSERT_OK((*relay)->Run());
  // Each published message comes twice (as a relay's republish after a
  // crash would bring it): the copy is the message as it arrived, headers
  // and all.
  auto first = paid->Receive(100, 0);
  ASSERT_OK(first);
  ASSERT_EQ(first->size(), 6u);
  for (const Delivery& d : *first) {
    ASSERT_TRUE(paid->Publish(d.message).ok());
    ASSERT_TRUE(paid->Nack(d, 0).ok());
  }

  auto shipping = Inbox::Open(*shipping_store, {.consumer = "shipping"});
  ASSERT_OK(shipping);
  const Handler ship = [&](Transaction&, const Message& m) -> Status {
    record("shipping/" + m.id);
    return Status::OK();
  };
  auto stage2 = Consumer::Open(*paid, **shipping, ship, {.stop_when_idle = true});
  ASSERT_OK(stage2);
  ASSERT_OK((*stage2)->Run());
  EXPECT_EQ((*stage2)->stats().acked, 12u);  // 6 rows, each published twice
  EXPECT_EQ((*shipping)->counters().duplicates, 6u);

  const std::string traced = std::string(kTrace) + "|vendor=x1";
  const std::string other = std::string(kOtherTrace) + "|";
  const std::map<std::string, std::vector<std::string>> want = {
      {"payments/order-1", {traced}},      {"payments/order-2", {"none"}},      {"payments/order-3", {"none"}},
      {"shipping/paid-order-1", {traced}}, {"shipping/paid-order-2", {"none"}}, {"shipping/paid-order-3", {"none"}},
      {"shipping/audit-order-1", {other}}, {"shipping/audit-order-2", {other}}, {"shipping/audit-order-3", {other}},
  };
  std::lock_guard lock(mu);
  EXPECT_EQ(seen, want);
}

TEST(Trace, AddOutsideAHandlerTakesTheCallersScope) {
  TempDir dir;
  auto store = OpenStore(dir, "s.db");
  auto paid = OpenQueue(dir, "paid");
  ASSERT_TRUE(store && paid);
  auto outbox = Outbox::Open(*store);
  ASSERT_TRUE(outbox.ok());
  {
    TraceScope scope({.traceparent = kTrace});
    auto tx = store->Begin();
    ASSERT_TRUE(tx.ok());
    ASSERT_TRUE((*outbox)->Add(**tx, {.destination = "paid", .id = "p-1", .payload = "x"}).ok());
    ASSERT_OK((*tx)->Commit());
  }
  auto tx = store->Begin();
  ASSERT_TRUE(tx.ok());
  ASSERT_TRUE((*outbox)->Add(**tx, {.destination = "paid", .id = "p-2", .payload = "x"}).ok());
  ASSERT_OK((*tx)->Commit());
  auto relay = OutboxRelay::Open(*store, *paid, {.poll_ms = 10, .stop_when_idle = true});
  ASSERT_TRUE(relay.ok());
  ASSERT_OK((*relay)->Run());
  auto got = paid->Receive(10, 0);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 2u);
  std::map<std::string, std::string> tp;
  for (const Delivery& d : *got) tp[d.message.id] = std::string(d.message.Header("traceparent").value_or("none"));
  EXPECT_EQ(tp, (std::map<std::string, std::string>{{"p-1", kTrace}, {"p-2", "none"}}));
}

}  // namespace
}  // namespace idem::testing
