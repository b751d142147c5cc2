// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The observer (idem/observer.h) and its two implementations (idem/metrics.h):
// every outcome of the Inbox, every delivery event of the Consumer, the
// lease overrun behind a rise in duplicates, the outbox's adds and the
// relay's publishes reach it; Metrics renders them in the Prometheus text
// format; JsonLog writes one escaped line per event. Every message is
// delivered twice.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "idem/claims.h"
#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "idem/metrics.h"
#include "idem/outbox.h"
#include "idem/outbox_relay.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "util/recording_observer.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

std::unique_ptr<Store> OpenStore(const TempDir& dir) {
  auto s = sqlite::Store::Open({.path = dir.File("store.db")});
  EXPECT_OK(s);
  EXPECT_TRUE(CreatePayments(**s).ok());
  return std::move(*s);
}

TEST(Observer, EveryInboxOutcomeIsToldWithItsTimes) {
  TempDir dir;
  auto store = OpenStore(dir);
  Recorder rec;
  auto inbox = MustOpen<Inbox>(*store, Inbox::Options{.consumer = "payments", .observer = &rec});
  Message m = Msg("m-7f3", "4000");
  m.headers.emplace_back("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  EXPECT_TRUE(inbox->Handle(m, ChargeHandler()).applied());
  EXPECT_EQ(inbox->Handle(m, ChargeHandler()).kind, Outcome::Kind::kDuplicate);  // delivered twice
  EXPECT_EQ(inbox->Handle(Msg("m-7f3", "9999"), ChargeHandler()).kind, Outcome::Kind::kConflict);
  const Handler failing = [](Transaction&, const Message&) { return Status::Unavailable("provider down"); };
  EXPECT_EQ(inbox->Handle(Msg("m-2"), failing).kind, Outcome::Kind::kFailed);
  const Handler rejecting = [](Transaction&, const Message&) { return Status::Rejected("malformed"); };
  EXPECT_EQ(inbox->Handle(Msg("m-3"), rejecting).kind, Outcome::Kind::kFailed);

  auto applied = rec.Of(EventKind::kApplied);
  ASSERT_EQ(applied.size(), 1u);
  EXPECT_EQ(applied[0].consumer, "payments");
  EXPECT_EQ(applied[0].id, "m-7f3");
  EXPECT_GE(applied[0].handler_us, 0);
  EXPECT_GE(applied[0].commit_us, 0);
  EXPECT_EQ(applied[0].traceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  ASSERT_EQ(rec.Of(EventKind::kDuplicate).size(), 1u);
  EXPECT_EQ(rec.Of(EventKind::kConflict).size(), 1u);
  auto failed = rec.Of(EventKind::kFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].detail.find("provider down"), std::string::npos) << failed[0].detail;
  EXPECT_EQ(rec.Of(EventKind::kRejected).size(), 1u);
  EXPECT_EQ(rec.size(), 5u);
}

TEST(Observer, WithoutAnObserverNothingIsTimed) {
  TempDir dir;
  auto store = OpenStore(dir);
  auto inbox = MustOpen<Inbox>(*store, Inbox::Options{.consumer = "payments"});
  Outcome o = inbox->Handle(Msg("m-1"), ChargeHandler());
  ASSERT_TRUE(o.applied());
  EXPECT_EQ(o.handler_us, -1);
  EXPECT_EQ(o.commit_us, -1);
}

// A Consumer on the embedded queue reports to its Inbox's observer: each
// delivery received and acknowledged, the duplicates skipped, a poison
// message's dead letter; Metrics counts them and renders the text format.
TEST(Observer, ConsumerEventsAreCountedAndRendered) {
  TempDir dir;
  auto store = OpenStore(dir);
  auto queue = embedded::Queue::Open({.path = dir.File("queue.db"), .durable = false});
  ASSERT_OK(queue);
  constexpr int kN = 20;
  for (int copy = 0; copy < 2; ++copy) {
    for (int i = 0; i < kN; ++i) ASSERT_TRUE((*queue)->Publish(Msg("m-" + std::to_string(i), "100")).ok());
    ASSERT_TRUE((*queue)->Publish(Msg("poison", "x")).ok());
  }
  Metrics metrics;
  Recorder rec;
  Observers both({&metrics, &rec});
  auto inbox = MustOpen<Inbox>(*store, Inbox::Options{.consumer = "payments", .observer = &both});
  const Handler handler = [](Transaction& tx, const Message& m) -> Status {
    if (m.id == "poison") return Status::HandlerFailed("cannot parse");
    return ChargeHandler()(tx, m);
  };
  auto consumer = MustOpen<Consumer>(**queue, *inbox, handler,
                                     Consumer::Options{.workers = 2,
                                                       .max_attempts = 1,
                                                       .backoff_base_ms = 1,
                                                       .backoff_max_ms = 5,
                                                       .receive_wait_ms = 20,
                                                       .stop_when_idle = true});
  ASSERT_TRUE(consumer->Run().ok());
  EXPECT_EQ(Charges(*store), kN);
  const ConsumerStats st = consumer->stats();
  EXPECT_EQ(metrics.Count(EventKind::kApplied, "payments"), static_cast<uint64_t>(kN));
  EXPECT_EQ(metrics.Count(EventKind::kDuplicate, "payments"), static_cast<uint64_t>(kN));
  EXPECT_EQ(metrics.Count(EventKind::kReceived, "payments"), st.received);
  EXPECT_EQ(metrics.Count(EventKind::kAcked, "payments"), st.acked);
  EXPECT_EQ(metrics.Count(EventKind::kDeadLettered, "payments"), st.dead_lettered);
  EXPECT_GE(st.dead_lettered, 1u);
  auto dead = rec.Of(EventKind::kDeadLettered);
  ASSERT_FALSE(dead.empty());
  EXPECT_EQ(dead[0].id, "poison");

  const std::string text = metrics.Render();
  EXPECT_NE(text.find("# TYPE idem_applied_total counter\nidem_applied_total{consumer=\"payments\"} " +
                      std::to_string(kN) + "\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("idem_duplicates_total{consumer=\"payments\"} " + std::to_string(kN) + "\n"), std::string::npos);
  EXPECT_NE(text.find("idem_lease_overruns_total{consumer=\"payments\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE idem_handler_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("idem_handler_seconds_bucket{consumer=\"payments\",le=\"+Inf\"} " + std::to_string(kN) + "\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("idem_commit_seconds_count{consumer=\"payments\"} " + std::to_string(kN) + "\n"),
            std::string::npos);
  // One HELP and one TYPE per metric.
  size_t helps = 0;
  for (size_t at = text.find("# HELP idem_applied_total"); at != std::string::npos;
       at = text.find("# HELP idem_applied_total", at + 1))
    ++helps;
  EXPECT_EQ(helps, 1u);
}

// A dead letter's event says why, as the dead-letter table does: the last
// failure's error, the rejection's reason, the crash loop's count.
TEST(Observer, DeadLetteredEventsCarryTheirReason) {
  TempDir dir;
  auto store = OpenStore(dir);
  FakeEnv env;
  auto queue = embedded::Queue::Open({.path = dir.File("queue.db"), .durable = false, .env = &env});
  ASSERT_OK(queue);
  for (const char* id : {"poison", "refused"}) ASSERT_TRUE((*queue)->Publish(Msg(id, "x")).ok());
  Recorder rec;
  auto inbox = MustOpen<Inbox>(*store, Inbox::Options{.consumer = "payments", .env = &env, .observer = &rec});
  const Handler handler = [](Transaction&, const Message& m) -> Status {
    if (m.id == "refused") return Status::Rejected("no such account");
    return Status::HandlerFailed("cannot parse");
  };
  auto consumer = MustOpen<Consumer>(
      **queue, *inbox, handler,
      Consumer::Options{.max_attempts = 2, .receive_wait_ms = 20, .stop_when_idle = true, .env = &env});
  ASSERT_TRUE(consumer->Run().ok());
  auto dead = rec.Of(EventKind::kDeadLettered);
  ASSERT_EQ(dead.size(), 2u);
  for (const auto& e : dead) {
    const std::string want = e.id == "refused" ? "no such account" : "cannot parse";
    EXPECT_NE(e.detail.find(want), std::string::npos) << e.id << ": '" << e.detail << "'";
  }
  auto letters = store->ListDeadLetters("payments", 10);
  ASSERT_OK(letters);
  ASSERT_EQ(letters->size(), 2u);
  for (const DeadLetter& l : *letters) {
    for (const auto& e : dead) {
      if (e.id != l.id) continue;
      EXPECT_EQ(e.detail, l.error) << "the event tells what the table keeps";
    }
  }
}

// The seed's signal: a handler that outlives its lease (renewal off) is
// told as a lease overrun with the message id and how long it took: the
// cause of the duplicates that follow when another consumer got the copy.
TEST(Observer, AHandlerThatOutlivesItsLeaseIsToldAsALeaseOverrun) {
  TempDir dir;
  auto store = OpenStore(dir);
  FakeEnv env;
  auto queue = embedded::Queue::Open({.path = dir.File("queue.db"), .lease_ms = 1'000, .durable = false, .env = &env});
  ASSERT_OK(queue);
  ASSERT_TRUE((*queue)->Publish(Msg("slow-1", "100")).ok());
  ASSERT_TRUE((*queue)->Publish(Msg("fast-1", "100")).ok());
  Metrics metrics;
  Recorder rec;
  Observers both({&metrics, &rec});
  auto inbox = MustOpen<Inbox>(*store, Inbox::Options{.consumer = "payments", .env = &env, .observer = &both});
  const Handler handler = [&](Transaction& tx, const Message& m) -> Status {
    if (m.id == "slow-1") env.Advance(1'500);  // longer than the lease
    return ChargeHandler()(tx, m);
  };
  auto consumer = MustOpen<Consumer>(
      **queue, *inbox, handler,
      Consumer::Options{
          .workers = 1, .receive_wait_ms = 20, .stop_when_idle = true, .extend_leases = false, .env = &env});
  ASSERT_TRUE(consumer->Run().ok());
  EXPECT_EQ(Charges(*store), 2);
  auto overruns = rec.Of(EventKind::kLeaseOverrun);
  ASSERT_EQ(overruns.size(), 1u);
  EXPECT_EQ(overruns[0].id, "slow-1");
  EXPECT_GE(overruns[0].handler_us, 1'500'000);
  EXPECT_EQ(metrics.Count(EventKind::kLeaseOverrun, "payments"), 1u);
  EXPECT_NE(metrics.Render().find("idem_lease_overruns_total{consumer=\"payments\"} 1\n"), std::string::npos);
}

TEST(Observer, TheOutboxAndTheRelayTellWhatTheyAddedAndPublished) {
  TempDir dir;
  auto store = OpenStore(dir);
  Metrics metrics;
  Recorder rec;
  Observers both({&metrics, &rec});
  auto outbox = Outbox::Open(*store, {.observer = &both});
  ASSERT_OK(outbox);
  for (int copy = 0; copy < 2; ++copy) {  // the same messages added twice
    auto tx = store->Begin();
    ASSERT_TRUE(tx.ok());
    for (int i = 0; i < 3; ++i) {
      OutgoingMessage m{.id = "paid-" + std::to_string(i), .key = "order-1", .payload = "paid"};
      m.headers.emplace_back("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
      ASSERT_TRUE((*outbox)->Add(**tx, m).ok());
    }
    ASSERT_OK((*tx)->Commit());
  }
  auto queue = embedded::Queue::Open({.path = dir.File("shipping.db"), .durable = false});
  ASSERT_TRUE(queue.ok());
  auto relay =
      OutboxRelay::Open(*store, **queue, {.name = "relay-a", .poll_ms = 10, .stop_when_idle = true, .observer = &both});
  ASSERT_OK(relay);
  ASSERT_OK((*relay)->Run());
  EXPECT_EQ(rec.Of(EventKind::kOutboxAdded).size(), 6u);
  auto published = rec.Of(EventKind::kOutboxPublished);
  ASSERT_EQ(published.size(), 6u);
  EXPECT_EQ(published[0].consumer, "relay-a");
  EXPECT_EQ(published[0].traceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  EXPECT_EQ(metrics.Count(EventKind::kOutboxPublished, "relay-a"), 6u);
  EXPECT_NE(metrics.Render().find("idem_outbox_published_total{relay=\"relay-a\"} 6\n"), std::string::npos)
      << metrics.Render();
}

// Claims tell each outcome and each holder's write: started, replayed,
// in progress, conflict, taken over after the lease, the old holder fenced,
// released; Metrics counts them per scope.
TEST(Observer, ClaimsTellEveryOutcomeAndTheFencedHolder) {
  TempDir dir;
  FakeEnv env;
  auto s = sqlite::Store::Open({.path = dir.File("claims.db"), .env = &env});
  ASSERT_OK(s);
  Metrics metrics;
  Recorder rec;
  Observers both({&metrics, &rec});
  auto claims = Claims::Open(*(*s)->claim_store(), {.env = &env, .observer = &both});
  ASSERT_OK(claims);
  const ClaimRequest charge{
      .scope = "charges", .key = "order-1:charge", .fingerprint = FingerprintOf("4000"), .lease_ms = 1'000};
  auto first = (*claims)->Claim(charge);
  ASSERT_TRUE(first.ok() && first->kind == ClaimOutcome::Kind::kStarted);
  auto busy = (*claims)->Claim(charge);  // the first holder's lease is live
  ASSERT_TRUE(busy.ok() && busy->kind == ClaimOutcome::Kind::kInProgress);
  env.Advance(1'500);  // its lease runs out
  auto second = (*claims)->Claim(charge);
  ASSERT_TRUE(second.ok() && second->took_over);
  EXPECT_EQ((*claims)->Complete(first->token, "ch_1").code(), Code::kLeaseLost);  // the zombie is fenced
  ASSERT_TRUE((*claims)->Complete(second->token, "ch_2").ok());
  for (int copy = 0; copy < 2; ++copy) {  // the retry, twice: replayed
    auto again = (*claims)->Claim(charge);
    ASSERT_TRUE(again.ok() && again->kind == ClaimOutcome::Kind::kCompleted);
  }
  ClaimRequest other = charge;
  other.fingerprint = FingerprintOf("9999");
  auto conflict = (*claims)->Claim(other);
  ASSERT_TRUE(conflict.ok() && conflict->kind == ClaimOutcome::Kind::kConflict);
  ClaimRequest email = charge;
  email.key = "order-1:email";
  auto mail = (*claims)->Claim(email);
  ASSERT_TRUE(mail.ok() && mail->kind == ClaimOutcome::Kind::kStarted);
  ASSERT_TRUE((*claims)->Fail(mail->token, FailPolicy::kRelease, "smtp down").ok());

  const std::pair<EventKind, size_t> want[] = {{EventKind::kClaimStarted, 2},   {EventKind::kClaimInProgress, 1},
                                               {EventKind::kClaimTakenOver, 1}, {EventKind::kClaimFenced, 1},
                                               {EventKind::kClaimCompleted, 1}, {EventKind::kClaimReplayed, 2},
                                               {EventKind::kClaimConflict, 1},  {EventKind::kClaimReleased, 1}};
  for (const auto& [kind, n] : want) {
    EXPECT_EQ(rec.Of(kind).size(), n) << EventKindName(kind);
    EXPECT_EQ(metrics.Count(kind, "charges"), n) << EventKindName(kind);
  }
  EXPECT_EQ(rec.Of(EventKind::kClaimFenced)[0].id, "order-1:charge");
  EXPECT_EQ(rec.Of(EventKind::kClaimFenced)[0].consumer, "charges");
  const std::string text = metrics.Render();
  EXPECT_NE(text.find("idem_claims_replayed_total{scope=\"charges\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("idem_claims_fenced_total{scope=\"charges\"} 1\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("idem_applied_total"), std::string::npos) << "no consumer series for a claims scope";
}

TEST(Observer, JsonLogWritesOneEscapedLinePerEvent) {
  std::vector<std::string> lines;
  JsonLog log([&](std::string_view line) { lines.emplace_back(line); });
  Event e;
  e.kind = EventKind::kFailed;
  e.consumer = "pay\"ments";
  e.message_id = "m-1";
  e.attempt = 2;
  e.detail = "line one\nline \\two\x01";
  e.at_ms = 1700000000000;
  log.OnEvent(e);
  e.kind = EventKind::kOutboxPublished;
  e.consumer = "relay";
  e.detail = {};
  e.attempt = 0;
  log.OnEvent(e);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "{\"at_ms\":1700000000000,\"event\":\"failed\",\"consumer\":\"pay\\\"ments\",\"id\":\"m-1\",\"attempt\":2,"
            "\"detail\":\"line one\\nline \\\\two\\u0001\"}");
  EXPECT_EQ(lines[1], "{\"at_ms\":1700000000000,\"event\":\"outbox_published\",\"relay\":\"relay\",\"id\":\"m-1\"}");
}

TEST(Observer, LabelValuesAreEscapedAndGaugesRendered) {
  Metrics metrics;
  Event e;
  e.kind = EventKind::kApplied;
  e.consumer = "a\"b\\c\nd";
  metrics.OnEvent(e);
  metrics.AddGauge("idem_outbox_backlog", "Messages not yet published.", "relay=\"r\"", [] { return 42.0; });
  const std::string text = metrics.Render();
  EXPECT_NE(text.find("idem_applied_total{consumer=\"a\\\"b\\\\c\\nd\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE idem_outbox_backlog gauge\nidem_outbox_backlog{relay=\"r\"} 42\n"), std::string::npos)
      << text;
  EXPECT_EQ(EventKindName(EventKind::kLeaseOverrun), "lease_overrun");
}

}  // namespace
}  // namespace idem::testing
