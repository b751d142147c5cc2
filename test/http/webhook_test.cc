// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The webhook receiver (idem/http/webhook.h), no network: deliveries signed
// by the senders' reference implementations (webhook_vectors/vectors.json:
// the standardwebhooks and stripe npm packages, GitHub's documented vector)
// verify; tampered bodies, wrong and rotated secrets, old and future
// timestamps are refused with nothing stored; a replay runs nothing; an id
// reused with another body is a counted conflict; a thousand concurrent
// retries of one event run its handler once; the enqueue form puts an event
// on the embedded queue once.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "idem/embedded/queue.h"
#include "idem/http/webhook.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/gtest.h"
#include "idem/testing/throwaway.h"

namespace idem::http {
namespace {

using idem::testing::TempDir;
using idem::testing::TempSqlite;

nlohmann::json Vectors() {
  std::ifstream in(std::string(IDEM_SOURCE_DIR) + "/test/http/webhook_vectors/vectors.json");
  return nlohmann::json::parse(in);
}

const int64_t kTs = 1'700'000'000;
// The vectors' sections and the schemes they sign for.
const std::pair<const char*, WebhookScheme> kSchemes[] = {
    {"standard", WebhookScheme::kStandard}, {"github", WebhookScheme::kGitHub}, {"stripe", WebhookScheme::kStripe}};

Request Delivery(WebhookScheme scheme, const nlohmann::json& v) {
  Request r{.method = "POST", .path = "/webhooks", .body = v["body"].get<std::string>()};
  const std::string sig = v["signature"].get<std::string>();
  switch (scheme) {
    case WebhookScheme::kStandard:
      r.headers.Add("webhook-id", v["id"].get<std::string>());
      r.headers.Add("webhook-timestamp", std::to_string(kTs));
      r.headers.Add("webhook-signature", sig);
      break;
    case WebhookScheme::kGitHub:
      r.headers.Add("X-GitHub-Delivery", v["id"].get<std::string>());
      r.headers.Add("X-GitHub-Event", "ping");
      r.headers.Add("X-Hub-Signature-256", sig);
      break;
    case WebhookScheme::kStripe: r.headers.Add("Stripe-Signature", sig); break;
  }
  return r;
}

std::unique_ptr<WebhookVerifier> Verifier(WebhookScheme scheme, const nlohmann::json& v, FakeEnv& clock) {
  auto r =
      WebhookVerifier::Open({.scheme = scheme, .secrets = v["secrets"].get<std::vector<std::string>>(), .env = &clock});
  EXPECT_OK(r);
  return std::move(*r);
}

TEST(WebhookVerifier, DeliveriesSignedByTheReferenceImplementationsVerify) {
  nlohmann::json all = Vectors();
  FakeEnv clock(kTs * 1000);
  for (auto [key, scheme] : kSchemes) {
    for (const auto& v : all[key]) {
      SCOPED_TRACE(std::string(key) + "/" + v["name"].get<std::string>());
      auto ev = Verifier(scheme, v, clock)->Verify(Delivery(scheme, v));
      ASSERT_OK(ev);
      if (v.contains("id")) {
        EXPECT_EQ(ev->id, v["id"].get<std::string>());
      }
    }
  }
  // The ids and types each scheme names.
  auto stripe = Verifier(WebhookScheme::kStripe, all["stripe"][0], clock)
                    ->Verify(Delivery(WebhookScheme::kStripe, all["stripe"][0]));
  ASSERT_OK(stripe);
  EXPECT_EQ(stripe->id, "evt_1NG8Du2eZvKYlo2CUI79vXWy");
  EXPECT_EQ(stripe->type, "charge.succeeded");
  EXPECT_EQ(stripe->timestamp_s, kTs);
  auto std1 = Verifier(WebhookScheme::kStandard, all["standard"][0], clock)
                  ->Verify(Delivery(WebhookScheme::kStandard, all["standard"][0]));
  EXPECT_EQ(std1->type, "invoice.paid");
  auto gh = Verifier(WebhookScheme::kGitHub, all["github"][0], clock)
                ->Verify(Delivery(WebhookScheme::kGitHub, all["github"][0]));
  EXPECT_EQ(gh->type, "ping");
  EXPECT_EQ(gh->timestamp_s, -1);
}

TEST(WebhookVerifier, ATamperedBodyAWrongSecretAndAMissingHeaderAreRefusedByName) {
  nlohmann::json all = Vectors();
  FakeEnv clock(kTs * 1000);
  for (auto [key, scheme] : kSchemes) {
    for (const auto& v : all[key]) {
      SCOPED_TRACE(std::string(key) + "/" + v["name"].get<std::string>());
      Request tampered = Delivery(scheme, v);
      tampered.body += " ";
      auto t = Verifier(scheme, v, clock)->Verify(tampered);
      EXPECT_TRUE(t.status().IsRejected()) << t.status();
      EXPECT_NE(t.status().message().find("does not verify"), std::string::npos) << t.status();
      if (v["name"] == "v1a") continue;  // a public key: no wrong HMAC secret to try
      nlohmann::json wrong = v;
      wrong["secrets"] = {scheme == WebhookScheme::kStandard ? "whsec_" + std::string("d3Jvbmcgc2VjcmV0") : "wrong"};
      EXPECT_TRUE(Verifier(scheme, wrong, clock)->Verify(Delivery(scheme, v)).status().IsRejected());
    }
  }
  Request bare{.method = "POST", .body = "{}"};
  auto v = WebhookVerifier::Open({.secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, .env = &clock});
  ASSERT_OK(v);
  auto missing = (*v)->Verify(bare);
  EXPECT_TRUE(missing.status().IsInvalidArgument());
  EXPECT_NE(missing.status().message().find("webhook-id header is missing"), std::string::npos) << missing.status();
  Request junk = Delivery(WebhookScheme::kStandard, all["standard"][0]);
  junk.headers.Set("webhook-signature", "v2,abc");
  EXPECT_NE((*v)->Verify(junk).status().message().find("no v1 or v1a signature"), std::string::npos);
  junk.headers.Set("webhook-timestamp", "yesterday");
  EXPECT_NE((*v)->Verify(junk).status().message().find("is not a number"), std::string::npos);
  EXPECT_TRUE(WebhookVerifier::Open({.secrets = {"whsec_!!!"}}).status().IsInvalidArgument());
  EXPECT_TRUE(WebhookVerifier::Open({.secrets = {}}).status().IsInvalidArgument());
  EXPECT_TRUE(WebhookVerifier::Open({.secrets = {"whpk_c2hvcnQ="}}).status().IsInvalidArgument());
}

TEST(WebhookVerifier, ATimestampBeyondTheToleranceEitherWayIsRefused) {
  nlohmann::json v = Vectors()["standard"][0];
  for (int64_t offset_s : {-301, 301}) {
    FakeEnv clock((kTs + offset_s) * 1000);
    auto r = Verifier(WebhookScheme::kStandard, v, clock)->Verify(Delivery(WebhookScheme::kStandard, v));
    EXPECT_TRUE(r.status().IsRejected()) << r.status();
    EXPECT_NE(r.status().message().find(offset_s > 0 ? "301 s old" : "301 s in the future"), std::string::npos)
        << r.status();
  }
  for (int64_t offset_s : {-299, 299}) {
    FakeEnv clock((kTs + offset_s) * 1000);
    EXPECT_OK(Verifier(WebhookScheme::kStandard, v, clock)->Verify(Delivery(WebhookScheme::kStandard, v)));
  }
  // A timestamp whose milliseconds overflow 64 bits (found by fuzz/webhook_fuzz.cc).
  FakeEnv now(kTs * 1000);
  Request far = Delivery(WebhookScheme::kStandard, v);
  far.headers.Set("webhook-timestamp", "1700000001700000000");
  auto r = Verifier(WebhookScheme::kStandard, v, now)->Verify(far);
  EXPECT_TRUE(r.status().IsRejected()) << r.status();
  EXPECT_NE(r.status().message().find("s in the future"), std::string::npos) << r.status();
  nlohmann::json s = Vectors()["stripe"][0];
  FakeEnv late((kTs + 400) * 1000);
  EXPECT_TRUE(
      Verifier(WebhookScheme::kStripe, s, late)->Verify(Delivery(WebhookScheme::kStripe, s)).status().IsRejected());
}

// A receiver on a throwaway SQLite store whose handler counts its runs.
struct Rig {
  FakeEnv clock{kTs * 1000};
  std::unique_ptr<TempSqlite> db = std::move(TempSqlite::Open(&clock).value());
  std::atomic<int> runs{0};
  std::unique_ptr<WebhookReceiver> receiver;
  const std::string secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

  explicit Rig(Handler handler = nullptr, int group_commit_max = 0) {
    if (!handler) {
      handler = [this](Transaction& tx, const Message& m) -> Status {
        runs++;
        return tx.Exec("CREATE TABLE IF NOT EXISTS events(id TEXT)").status().ok()
                   ? tx.Exec("INSERT INTO events VALUES ($1)", {m.id}).status()
                   : Status::Internal("table");
      };
    }
    auto r = WebhookReceiver::Open(
        db->store(), handler, {.verify = {.secrets = {secret}, .env = &clock}, .group_commit_max = group_commit_max});
    EXPECT_OK(r);
    receiver = std::move(*r);
  }
  // A delivery of `id` signed now (a retry is signed anew).
  Request Signed(const std::string& id, const std::string& body) {
    Request r{.method = "POST", .path = "/webhooks", .body = body};
    r.headers = SignWebhook(WebhookScheme::kStandard, secret, id, clock.NowMs() / 1000, body).value();
    return r;
  }
  int64_t Markers() { return db->store().CountMarkers("webhooks").value(); }
  int64_t Rows(const std::string& id = "") {
    auto tx = db->store().Begin();
    auto rows = id.empty() ? (*tx)->Query("SELECT count(*) FROM events")
                           : (*tx)->Query("SELECT count(*) FROM events WHERE id = $1", {id});
    return rows.ok() ? rows->rows[0][0].AsInt() : -1;
  }
};

TEST(WebhookReceiver, AnEventRunsOnceItsRetriesReplayAndAReusedIdIsAConflict) {
  Rig rig;
  Answer first = rig.receiver->Handle(rig.Signed("evt-1", "{\"type\":\"paid\"}"));
  EXPECT_EQ(first.status, 200);
  EXPECT_NE(first.body.find("\"outcome\":\"applied\""), std::string::npos) << first.body;
  // The sender retries two minutes later, signed anew: 200, nothing run.
  rig.clock.Advance(120'000);
  Answer retry = rig.receiver->Handle(rig.Signed("evt-1", "{\"type\":\"paid\"}"));
  EXPECT_EQ(retry.status, 200);
  EXPECT_NE(retry.body.find("\"outcome\":\"duplicate\""), std::string::npos) << retry.body;
  Answer reused = rig.receiver->Handle(rig.Signed("evt-1", "{\"type\":\"refunded\"}"));
  EXPECT_EQ(reused.status, 422) << reused.body;
  EXPECT_EQ(rig.runs, 1);
  EXPECT_EQ(rig.receiver->counters().applied, 1u);
  EXPECT_EQ(rig.receiver->counters().replayed, 1u);
  EXPECT_EQ(rig.receiver->counters().conflicts, 1u);
}

TEST(WebhookReceiver, AStripeEventRedeliveredWithAnotherPendingWebhooksCountIsAReplay) {
  // Stripe renders an event's body anew for each delivery: pending_webhooks
  // falls as other endpoints answer. The signed id names the event.
  FakeEnv clock(kTs * 1000);
  auto db = TempSqlite::Open(&clock);
  ASSERT_OK(db);
  std::atomic<int> runs{0};
  auto receiver =
      WebhookReceiver::Open((*db)->store(), [&](Transaction&, const Message&) { return runs++, Status::OK(); },
                            {.verify = {.scheme = WebhookScheme::kStripe, .secrets = {"whsec_stripe"}, .env = &clock}});
  ASSERT_OK(receiver);
  auto deliver = [&](int pending) {
    Request r{.method = "POST",
              .body = R"({"id":"evt_1","object":"event","type":"invoice.paid","pending_webhooks":)" +
                      std::to_string(pending) + "}"};
    r.headers = SignWebhook(WebhookScheme::kStripe, "whsec_stripe", "", clock.NowMs() / 1000, r.body).value();
    return (*receiver)->Handle(r);
  };
  EXPECT_EQ(deliver(3).status, 200);
  clock.Advance(300'000);
  Answer again = deliver(2);
  EXPECT_EQ(again.status, 200);
  EXPECT_NE(again.body.find("\"outcome\":\"duplicate\""), std::string::npos) << again.body;
  EXPECT_EQ(runs, 1);
  EXPECT_EQ((*receiver)->counters().conflicts, 0u);
  auto letters = (*db)->store().ListDeadLetters("webhooks", 10);
  ASSERT_OK(letters);
  EXPECT_TRUE(letters->empty());
}

TEST(WebhookReceiver, AForgedOrMalformedDeliveryIsRefusedWithNothingStored) {
  Rig rig;
  Request forged = rig.Signed("evt-2", "{\"amount\":1}");
  forged.body = "{\"amount\":1000000}";
  Answer a = rig.receiver->Handle(forged);
  EXPECT_EQ(a.status, 401);
  EXPECT_NE(a.body.find("does not verify"), std::string::npos) << a.body;
  Request bare{.method = "POST", .body = "{}"};
  EXPECT_EQ(rig.receiver->Handle(bare).status, 400);
  rig.clock.Advance(3'600'000);  // a captured delivery replayed an hour later
  Request stale = forged;
  stale.body = "{\"amount\":1}";
  EXPECT_EQ(rig.receiver->Handle(stale).status, 401);
  EXPECT_EQ(rig.runs, 0);
  EXPECT_EQ(rig.Markers(), 0);
  EXPECT_EQ(rig.receiver->counters().unverified, 2u);
  EXPECT_EQ(rig.receiver->counters().malformed, 1u);
}

// Every error body names the event id in its "id" field, for each scheme:
// a forged signature and a stale timestamp (401), a malformed signature
// header (400); a request that carries no id has no "id".
TEST(WebhookReceiver, EveryErrorBodyNamesTheEventIdInItsIdField) {
  FakeEnv clock(kTs * 1000);
  auto db = TempSqlite::Open(&clock);
  ASSERT_OK(db);
  const std::string body = R"({"id":"evt_7","type":"invoice.paid"})";
  struct Case {
    WebhookScheme scheme;
    std::string secret, signature_header, malformed_signature;
    bool signs_time;
  };
  for (const Case& c : {Case{WebhookScheme::kStandard, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "webhook-signature",
                             "no-signature-here", true},
                        Case{WebhookScheme::kGitHub, "gh secret", "X-Hub-Signature-256", "md5=00", false},
                        Case{WebhookScheme::kStripe, "whsec_stripe", "Stripe-Signature", "t=1", true}}) {
    SCOPED_TRACE(std::string(WebhookSchemeName(c.scheme)));
    auto receiver = WebhookReceiver::Open((*db)->store(), [](Transaction&, const Message&) { return Status::OK(); },
                                          {.verify = {.scheme = c.scheme, .secrets = {c.secret}, .env = &clock},
                                           .consumer = "ids-" + std::string(WebhookSchemeName(c.scheme))});
    ASSERT_OK(receiver);
    auto signed_at = [&](int64_t ts_s, const std::string& b) {
      Request r{.method = "POST", .path = "/webhooks", .body = b};
      r.headers = SignWebhook(c.scheme, c.secret, "evt_7", ts_s, b).value();
      return r;
    };
    auto expect_id = [&](const Request& r, int status, const char* what) {
      Answer a = (*receiver)->Handle(r);
      EXPECT_EQ(a.status, status) << what << ": " << a.body;
      auto j = nlohmann::json::parse(a.body, nullptr, false);
      ASSERT_TRUE(j.is_object()) << a.body;
      EXPECT_EQ(j.value("id", ""), "evt_7") << what << ": " << a.body;
      EXPECT_TRUE(j.contains("error")) << what << ": " << a.body;
    };
    Request forged = signed_at(kTs, body);
    forged.body = R"({"id":"evt_7","type":"invoice.paid","amount":1000000})";
    expect_id(forged, 401, "forged");
    if (c.signs_time) expect_id(signed_at(kTs - 3'600, body), 401, "stale");
    Request malformed = signed_at(kTs, body);
    malformed.headers.Set(c.signature_header, c.malformed_signature);
    expect_id(malformed, 400, "malformed");
    // Nothing names an event: no "id".
    Answer bare = (*receiver)->Handle(Request{.method = "POST", .body = "{}"});
    EXPECT_EQ(bare.status, 400);
    EXPECT_FALSE(nlohmann::json::parse(bare.body).contains("id")) << bare.body;
  }
}

// StopOnSignals(receiver): after a SIGTERM raised in the process, a delivery
// is answered 503 with Retry-After and its event id, nothing stored (the
// sender delivers it again); one being handled when the signal came finishes.
TEST(WebhookReceiver, AfterSigtermDeliveriesAreAnswered503AndNothingIsStored) {
  Rig* self = nullptr;
  Rig rig([&](Transaction& tx, const Message& m) -> Status {
    self->runs++;
    ::raise(SIGTERM);  // while this delivery is being handled
    return tx.Exec("CREATE TABLE IF NOT EXISTS events(id TEXT)").status().ok()
               ? tx.Exec("INSERT INTO events VALUES ($1)", {m.id}).status()
               : Status::Internal("table");
  });
  self = &rig;
  StopOnSignals(rig.receiver.get());
  EXPECT_FALSE(rig.receiver->stopping());
  Answer first = rig.receiver->Handle(rig.Signed("evt-1", "{}"));
  EXPECT_EQ(first.status, 200) << first.body;
  EXPECT_TRUE(rig.receiver->stopping());
  Answer later = rig.receiver->Handle(rig.Signed("evt-2", "{}"));
  EXPECT_EQ(later.status, 503) << later.body;
  EXPECT_EQ(later.headers.Get("Retry-After"), "1");
  EXPECT_NE(later.body.find("\"id\":\"evt-2\""), std::string::npos) << later.body;
  EXPECT_EQ(rig.runs, 1);
  EXPECT_EQ(rig.Markers(), 1);
  EXPECT_EQ(rig.receiver->counters().stopped, 1u);
  rig.receiver.reset();  // detaches
  StopOnSignals(nullptr);
}

TEST(WebhookReceiver, AThousandConcurrentRetriesOfOneEventRunItsHandlerOnce) {
  Rig rig;
  const Request delivery = rig.Signed("evt-storm", "{\"type\":\"paid\"}");
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 125; ++i) ok += rig.receiver->Handle(delivery).status == 200;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 1000);
  EXPECT_EQ(rig.runs, 1);
  EXPECT_EQ(rig.receiver->counters().applied + rig.receiver->counters().replayed, 1000u);
}

TEST(WebhookReceiver, UnderGroupCommitEveryEventCommitsOnceAndAFailingOneCostsTheOthersNothing) {
  // 16 senders at once, 200 events each delivered twice (the second copy
  // often in the same group as the first), but event 77 once: its handling
  // fails the first time, and its sender retries after the 500.
  std::atomic<bool> failed_once{false};
  Rig rig(
      [&](Transaction& tx, const Message& m) -> Status {
        if (m.id == "evt-77" && !failed_once.exchange(true)) return Status::Unavailable("downstream blip");
        IDEM_RETURN_IF_ERROR(tx.Exec("CREATE TABLE IF NOT EXISTS events(id TEXT)").status());
        return tx.Exec("INSERT INTO events VALUES ($1)", {m.id}).status();
      },
      /*group_commit_max=*/8);
  std::vector<Request> deliveries;
  for (int copy = 0; copy < 2; ++copy) {
    for (int i = 0; i < 200; ++i) {
      if (copy == 1 && i == 77) continue;
      const std::string id = "evt-" + std::to_string(i);
      deliveries.push_back(rig.Signed(id, "{\"type\":\"paid\",\"n\":" + std::to_string(i) + "}"));
    }
  }
  std::atomic<size_t> next{0};
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> senders;
  for (int t = 0; t < 16; ++t) {
    senders.emplace_back([&] {
      for (size_t i; (i = next++) < deliveries.size();) {
        const int status = rig.receiver->Handle(deliveries[i]).status;
        (status == 200 ? ok : failed)++;
      }
    });
  }
  for (auto& t : senders) t.join();
  // The failed delivery of evt-77 was answered 500; its sender retries.
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(rig.receiver->Handle(rig.Signed("evt-77", "{\"type\":\"paid\",\"n\":77}")).status, 200);
  EXPECT_EQ(ok, 398);
  EXPECT_EQ(rig.Rows(), 200);
  for (int i : {0, 77, 199}) EXPECT_EQ(rig.Rows("evt-" + std::to_string(i)), 1) << i;
  EXPECT_EQ(rig.Markers(), 200);
  const WebhookCounters c = rig.receiver->counters();
  EXPECT_EQ(c.applied, 200u);
  EXPECT_EQ(c.replayed, 199u);
  EXPECT_EQ(c.failed, 1u);
  EXPECT_EQ(c.grouped, 400u);  // every delivery went through a group
  EXPECT_GE(c.group_commits, 1u);
  EXPECT_LE(c.group_commits, 400u);
  EXPECT_TRUE(WebhookReceiver::Open(rig.db->store(), [](Transaction&, const Message&) { return Status::OK(); },
                                    {.verify = {.secrets = {rig.secret}}, .group_commit_max = -1})
                  .status()
                  .IsInvalidArgument());
}

TEST(WebhookReceiver, AnEventTheHandlerRejectsIsDeadLetteredAndAnswered200) {
  Rig rig([](Transaction&, const Message&) { return Status::Rejected("unknown event type"); });
  Answer a = rig.receiver->Handle(rig.Signed("evt-odd", "{\"type\":\"odd\"}"));
  EXPECT_EQ(a.status, 200);
  EXPECT_NE(a.body.find("\"outcome\":\"rejected\""), std::string::npos) << a.body;
  auto letters = rig.db->store().ListDeadLetters("webhooks", 10);
  ASSERT_OK(letters);
  ASSERT_EQ(letters->size(), 1u);
  EXPECT_EQ((*letters)[0].id, "evt-odd");
  EXPECT_EQ((*letters)[0].reason, "rejected");
}

TEST(WebhookReceiver, TheEnqueueFormPutsEachEventOnTheQueueOnce) {
  FakeEnv clock(kTs * 1000);
  auto db = TempSqlite::Open(&clock);
  ASSERT_OK(db);
  TempDir dir;
  auto queue = embedded::Queue::Open({.path = dir.File("queue.db"), .queue = "webhooks"});
  ASSERT_OK(queue);
  const std::string secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  auto receiver = WebhookReceiver::Open((*db)->store(), **queue, {.verify = {.secrets = {secret}, .env = &clock}});
  ASSERT_OK(receiver);
  for (int copy = 0; copy < 3; ++copy) {
    for (std::string id : {"evt-a", "evt-b"}) {
      Request r{.method = "POST", .body = "{\"id\":\"" + id + "\"}"};
      r.headers = SignWebhook(WebhookScheme::kStandard, secret, id, clock.NowMs() / 1000, r.body).value();
      Answer a = (*receiver)->Handle(r);
      EXPECT_EQ(a.status, 200) << a.body;
      EXPECT_NE(a.body.find(copy == 0 ? "enqueued" : "duplicate"), std::string::npos) << a.body;
    }
  }
  auto got = (*queue)->Receive(10, 0);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].message.id, "evt-a");
  EXPECT_EQ((*got)[0].message.payload, "{\"id\":\"evt-a\"}");
  EXPECT_EQ((*got)[1].message.id, "evt-b");
}

TEST(SignWebhook, WhatItSignsEachSchemesVerifierVerifies) {
  FakeEnv clock(kTs * 1000);
  const std::string body = "{\"id\":\"evt_9\",\"type\":\"x\"}";
  for (auto [scheme, secret] :
       {std::pair{WebhookScheme::kStandard, std::string("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")},
        std::pair{WebhookScheme::kGitHub, std::string("gh secret")},
        std::pair{WebhookScheme::kStripe, std::string("whsec_stripe")}}) {
    Request r{.method = "POST", .body = body};
    r.headers = SignWebhook(scheme, secret, "evt_9", kTs, body).value();
    auto v = WebhookVerifier::Open({.scheme = scheme, .secrets = {secret}, .env = &clock});
    ASSERT_OK(v);
    auto ev = (*v)->Verify(r);
    ASSERT_OK(ev);
    EXPECT_EQ(ev->id, "evt_9");
  }
  EXPECT_EQ(ParseWebhookScheme("github").value(), WebhookScheme::kGitHub);
  EXPECT_NE(ParseWebhookScheme("gitlab").status().message().find("known: standard, github, stripe"), std::string::npos);
}

}  // namespace
}  // namespace idem::http
