// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The provider's cases, for every store it runs on (see provider_cases.h).
#include "http/provider_cases.h"

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "idem/http/client.h"

namespace idem::testing {
namespace {

constexpr char kBody[] = R"({"amount":4000,"currency":"usd","customer":"cus_1","description":"order 42"})";

TEST_P(ProviderTest, ChargesOnceAndReplays) {
  Start();
  Reply first = Charge("order-42", kBody);
  ASSERT_TRUE(first.ok) << first.error;
  ASSERT_EQ(first.status, 201) << first.body;
  EXPECT_FALSE(first.has("Idempotent-Replayed"));
  auto charge = first.json();
  ASSERT_TRUE(charge.is_object()) << first.body;
  const std::string id = charge.value("id", "");
  EXPECT_EQ(id.rfind("ch_", 0), 0u) << id;
  EXPECT_EQ(charge.value("amount", 0), 4000);
  EXPECT_EQ(charge.value("currency", ""), "usd");
  EXPECT_EQ(charge.value("idempotency_key", ""), "order-42");
  EXPECT_EQ(first.header("Location"), "/charges/" + id);
  EXPECT_EQ(first.header("Content-Type"), "application/json");
  for (int i = 0; i < 2; ++i) {
    Reply again = Charge("order-42", kBody);
    EXPECT_TRUE(again.replayed());
    ExpectSameResponse(first, again);
  }
  Reply read = Get("/charges/" + id);
  EXPECT_EQ(read.status, 200);
  EXPECT_EQ(read.json(), charge);
  EXPECT_EQ(Charges().size(), 1u);
  EXPECT_EQ(Get("/health").body, "healthy");
  auto c = provider_->counters();
  EXPECT_EQ(c.executed, 1u);
  EXPECT_EQ(c.replayed, 2u);
}

// Text that JSON must escape comes back as it was sent, in the same bytes
// nlohmann::json writes (the provider writes charges without it), from the
// POST, its replay, GET /charges/{id} and GET /charges.
TEST_P(ProviderTest, AChargesTextComesBackExactlyInCanonicalJson) {
  Start();
  const std::string text = "quote \" backslash \\ newline \n tab \t bell \x07 del \x7f slash / \xc3\xa9 \xe6\x97\xa5";
  nlohmann::json body = {{"amount", 1234}, {"currency", "eur"}, {"customer", "cus_\"x\""}, {"description", text}};
  Reply first = Charge("text-1", body.dump());
  ASSERT_EQ(first.status, 201) << first.body;
  nlohmann::json charge = first.json();
  ASSERT_TRUE(charge.is_object()) << first.body;
  EXPECT_EQ(charge["description"], text);
  EXPECT_EQ(charge["customer"], "cus_\"x\"");
  EXPECT_EQ(charge["amount"], 1234);
  EXPECT_EQ(first.body, charge.dump()) << "not the canonical form";
  Reply again = Charge("text-1", body.dump());
  EXPECT_TRUE(again.replayed());
  EXPECT_EQ(again.body, first.body);
  Reply one = Get("/charges/" + charge["id"].get<std::string>());
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(one.body, first.body);
  Reply list = Get("/charges?customer=cus_%22x%22");
  ASSERT_EQ(list.status, 200) << list.body;
  EXPECT_EQ(list.body, "{\"data\":[" + first.body + "],\"object\":\"list\"}");
  EXPECT_EQ(list.body, list.json().dump());
}

// POST /v1/charges: Stripe's dialect (form bodies, 200 and a charge
// object, a key optional, Stripe's errors), on the same charges.
TEST_P(ProviderTest, TheStripeDialectChargesOncePerKeyWithStripesErrors) {
  Start();
  constexpr char kForm[] = "application/x-www-form-urlencoded";
  auto post = [&](std::optional<std::string> key, const std::string& body) {
    return Send(provider_->port(), "POST", "/v1/charges", Headers("sk_a", std::move(key)), body, kForm);
  };
  const std::string body = "amount=4000&currency=USD&customer=cus_1&description=order+42%21";
  Reply first = post("st-1", body);
  ASSERT_EQ(first.status, 200) << first.body;
  auto charge = first.json();
  EXPECT_EQ(charge.value("object", ""), "charge");
  EXPECT_EQ(charge.value("amount", 0), 4000);
  EXPECT_EQ(charge.value("currency", ""), "usd");  // lower-cased, as Stripe does
  EXPECT_EQ(charge.value("description", ""), "order 42!");
  EXPECT_EQ(charge.value("status", ""), "succeeded");
  const std::string id = charge.value("id", "");
  // A retry, and the same parameters in another order: the same charge.
  for (const std::string& again :
       {body, std::string("description=order%2042!&customer=cus_1&currency=USD&amount=4000")}) {
    Reply r = post("st-1", again);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_TRUE(r.replayed());
    EXPECT_EQ(r.body, first.body);
  }
  // The key with other parameters: 400 idempotency_error, no charge.
  Reply conflict = post("st-1", "amount=1&currency=usd");
  EXPECT_EQ(conflict.status, 400);
  EXPECT_EQ(conflict.json()["error"].value("type", ""), "idempotency_error") << conflict.body;
  // Bad parameters: 400 naming the parameter, before anything is claimed.
  for (const auto& [bad, param] :
       std::vector<std::pair<std::string, std::string>>{{"currency=usd", "amount"},
                                                        {"amount=-1&currency=usd", "amount"},
                                                        {"amount=1&currency=dollars", "currency"},
                                                        {"amount=1&currency=usd&amount=2", "amount"},
                                                        {"amount=1&currency=usd&source=tok_visa", "source"}}) {
    Reply r = post("st-bad", bad);
    EXPECT_EQ(r.status, 400) << bad;
    EXPECT_EQ(r.json()["error"].value("type", ""), "invalid_request_error") << r.body;
    EXPECT_EQ(r.json()["error"].value("param", ""), param) << r.body;
  }
  // Without a key, as Stripe allows: each request a charge of its own.
  for (int i = 0; i < 2; ++i) EXPECT_EQ(post(std::nullopt, "amount=7&currency=eur").status, 200);
  // Read back: newest first, paged as Stripe's clients page.
  Reply page = Get("/v1/charges?limit=2");
  ASSERT_EQ(page.status, 200) << page.body;
  auto list = page.json();
  ASSERT_EQ(list["data"].size(), 2u) << page.body;
  EXPECT_TRUE(list.value("has_more", false));
  Reply rest = Get("/v1/charges?limit=2&starting_after=" + list["data"][1].value("id", ""));
  ASSERT_EQ(rest.status, 200) << rest.body;
  ASSERT_EQ(rest.json()["data"].size(), 1u) << rest.body;
  EXPECT_FALSE(rest.json().value("has_more", true));
  std::set<std::string> paged, all;
  for (const auto& c : list["data"]) paged.insert(c.value("id", ""));
  paged.insert(rest.json()["data"][0].value("id", ""));
  for (const auto& c : Charges()) all.insert(c.value("id", ""));
  EXPECT_EQ(paged, all);
  EXPECT_TRUE(all.count(id));
  EXPECT_EQ(Get("/v1/charges/" + id).json().value("amount", 0), 4000);
  Reply missing = Get("/v1/charges/ch_nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.json()["error"].value("code", ""), "resource_missing");
  EXPECT_EQ(Get("/v1/charges", "sk_wrong").status, 401);
  EXPECT_EQ(Get("/v1/charges?limit=0").status, 400);
  // The JSON API sees the same charges.
  EXPECT_EQ(Charges().size(), 3u);
  EXPECT_EQ(provider_->counters().executed, 1u);  // the keyless ones ran unguarded
  EXPECT_EQ(provider_->counters().conflicts, 1u);
}

TEST_P(ProviderTest, MetricsCountExecutionsReplaysAndConflicts) {
  Start();
  ASSERT_EQ(Charge("m-1", kBody).status, 201);
  for (int again = 0; again < 2; ++again) EXPECT_TRUE(Charge("m-1", kBody).replayed());
  EXPECT_EQ(Charge("m-1", R"({"amount":9999,"currency":"usd","customer":"cus_1"})").status, 422);
  for (int again = 0; again < 2; ++again) EXPECT_EQ(Charge("m-2", R"({"amount":0,"currency":"usd"})").status, 400);
  Reply m = Send(provider_->port(), "GET", "/metrics", {});
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_NE(m.header("Content-Type").find("text/plain"), std::string::npos);
  for (const char* line :
       {"# TYPE idem_http_executed_total counter\nidem_http_executed_total 1\n", "idem_http_replayed_total 2\n",
        "idem_http_conflicts_total 1\n", "# TYPE idem_http_group_queue gauge\nidem_http_group_queue 0\n",
        "idem_http_invalid_total 2\n", "idem_http_group_reruns_total 0\n"})
    EXPECT_NE(m.body.find(line), std::string::npos) << line << "\n" << m.body;
  const bool groups =
      GetParam().mode == ProviderMode::kGroupCommit || GetParam().mode == ProviderMode::kGroupCommitOnFibers;
  const std::string grouped = groups ? "1" : "0";
  EXPECT_NE(m.body.find("idem_http_grouped_requests_total " + grouped + "\n"), std::string::npos) << m.body;
}

TEST_P(ProviderTest, ReplaysAfterARestart) {
  Start();
  Reply first = Charge("restart-1", kBody);
  ASSERT_EQ(first.status, 201) << first.body;
  provider_->Stop();
  provider_.reset();
  Start();  // the same store, a new process-lifetime of the server
  for (int i = 0; i < 2; ++i) {
    Reply again = Charge("restart-1", kBody);
    ASSERT_TRUE(again.ok) << again.error;
    EXPECT_TRUE(again.replayed());
    ExpectSameResponse(first, again);
    EXPECT_EQ(again.json().value("id", "?"), first.json().value("id", "!"));
  }
  EXPECT_EQ(Get(first.header("Location")).json().value("id", ""), first.json().value("id", "?"));
  EXPECT_EQ(Charges().size(), 1u);
  EXPECT_EQ(provider_->counters().executed, 0u);
}

TEST_P(ProviderTest, AnotherPrincipalSendingTheSameKeyGetsItsOwnCharge) {
  Start();
  Reply a = Charge("shared-key", kBody, "sk_a");
  ASSERT_EQ(a.status, 201) << a.body;
  for (int i = 0; i < 2; ++i) {
    Reply b = Charge("shared-key", kBody, "sk_b");
    ASSERT_EQ(b.status, 201) << b.body;
    EXPECT_EQ(b.replayed(), i == 1);
    EXPECT_NE(b.body, a.body);
    EXPECT_NE(b.json().value("id", ""), a.json().value("id", ""));
    EXPECT_NE(b.header("Location"), a.header("Location"));
    // B never reads A's charge.
    EXPECT_EQ(Get(a.header("Location"), "sk_b").status, 404);
    Reply a_again = Charge("shared-key", kBody, "sk_a");
    EXPECT_TRUE(a_again.replayed());
    ExpectSameResponse(a, a_again);
  }
  // B may even use the key for another body: it is B's key, not A's.
  EXPECT_EQ(Charge("a-only", kBody, "sk_a").status, 201);
  EXPECT_TRUE(Charge("a-only", kBody, "sk_a").replayed());
  Reply other = Charge("a-only", R"({"amount":1,"currency":"eur"})", "sk_b");
  EXPECT_EQ(other.status, 201) << other.body;
  EXPECT_TRUE(Charge("a-only", R"({"amount":1,"currency":"eur"})", "sk_b").replayed());
  EXPECT_EQ(Charges("sk_a").size(), 2u);
  EXPECT_EQ(Charges("sk_b").size(), 2u);
}

TEST_P(ProviderTest, AReorderedJsonBodyReplaysAndAChangedAmountIs422) {
  Start();
  Reply first = Charge("json-1", kBody);
  ASSERT_EQ(first.status, 201) << first.body;
  const std::string reordered =
      "{\n  \"description\" : \"order 42\",\n  \"customer\": \"cus_1\",\t\"currency\":\"usd\",  \"amount\" :4000\n}\n";
  for (int i = 0; i < 2; ++i) {
    Reply again = Charge("json-1", reordered);
    EXPECT_TRUE(again.replayed()) << again.status << " " << again.body;
    ExpectSameResponse(first, again);
  }
  for (int i = 0; i < 2; ++i) {
    Reply changed = Charge("json-1", R"({"amount":5000,"currency":"usd","customer":"cus_1","description":"order 42"})");
    EXPECT_EQ(changed.status, 422) << changed.body;
    EXPECT_EQ(changed.header("Content-Type"), "application/problem+json");
    EXPECT_EQ(changed.json().value("type", ""), "https://idem.dev/problems/idempotency-key-reused");
    EXPECT_EQ(changed.json().value("retry", ""), "new-key");
  }
  auto all = Charges();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].value("amount", 0), 4000);
}

TEST_P(ProviderTest, AnInvalidBodyIs400AndReleasesTheKey) {
  Start();
  const char* const kBad[] = {R"({"amount":-5,"currency":"usd"})",
                              R"({"amount":4000,"currency":"dollars"})",
                              R"({"amount":4000,"currency":"usd","customer":42})",
                              "not json",
                              R"({"amount":40.5,"currency":"usd"})",
                              R"({"amount":18446744073709551615,"currency":"usd"})",
                              R"({"amount":{"value":4000},"currency":"usd"})",
                              R"({"amount":4000,"currency":["usd"]})",
                              R"({"amount":4000,"currency":"usd","description":null})",
                              R"({"amount":4000,"currency":"usd","amount":0})",
                              R"([{"amount":4000,"currency":"usd"}])",
                              R"({"amount":4000,"currency":"usd"} trailing)",
                              R"("a string")"};
  for (const char* bad : kBad) {
    for (int i = 0; i < 2; ++i) {
      Reply r = Charge("fix-me", bad);
      EXPECT_EQ(r.status, 400) << bad;
      EXPECT_FALSE(r.replayed());
      EXPECT_EQ(r.header("Content-Type"), "application/problem+json");
    }
  }
  EXPECT_EQ(Charges().size(), 0u);
  // Refused before the claim: never executed, never grouped.
  EXPECT_EQ(provider_->counters().invalid, 2 * std::size(kBad));
  EXPECT_EQ(provider_->counters().executed, 0u);
  EXPECT_EQ(provider_->counters().group_reruns, 0u);
  // The key was released each time: the corrected request runs with it.
  Reply ok = Charge("fix-me", kBody);
  EXPECT_EQ(ok.status, 201);
  EXPECT_FALSE(ok.replayed());
  EXPECT_TRUE(Charge("fix-me", kBody).replayed());
  EXPECT_EQ(Charges().size(), 1u);
}

// What the charge's fields are read from: the top-level members, nested
// values ignored.
TEST_P(ProviderTest, AChargeIsReadFromTheBodysTopLevelMembers) {
  Start();
  const std::string body = R"({"meta":{"amount":1,"currency":"xxx","list":[1,{"customer":7}]},"amount":2500,)"
                           R"("currency":"gbp","customer":"cus_9","tags":["a",{"b":null}],"description":"last"})";
  Reply r = Charge("members-1", body);
  ASSERT_EQ(r.status, 201) << r.body;
  Reply again = Charge("members-1", body);  // every request twice: the second replays
  EXPECT_TRUE(again.replayed());
  EXPECT_EQ(again.body, r.body);
  nlohmann::json c = r.json();
  EXPECT_EQ(c["amount"], 2500);
  EXPECT_EQ(c["currency"], "gbp");
  EXPECT_EQ(c["customer"], "cus_9");
  EXPECT_EQ(c["description"], "last");
  Reply plain = Charge("members-2", R"({"currency":"usd","amount":7})");  // no customer, no description
  ASSERT_EQ(plain.status, 201) << plain.body;
  EXPECT_TRUE(Charge("members-2", R"({"currency":"usd","amount":7})").replayed());
  EXPECT_EQ(Charges().size(), 2u);
  EXPECT_EQ(plain.json()["customer"], "");
  EXPECT_EQ(plain.json()["description"], "");
}

// A member given twice is refused, at any depth: parsers differ on which
// one counts, and a charge must mean one amount. Bad JSON is named as such.
TEST_P(ProviderTest, AMemberGivenTwiceIsRefusedAndNamed) {
  Start();
  for (int i = 0; i < 2; ++i) {
    Reply twice = Charge("twice-1", R"({"amount":100,"currency":"usd","amount":200})");
    EXPECT_EQ(twice.status, 400) << twice.body;
    EXPECT_NE(twice.json().value("detail", "").find(R"(the member "amount" is given twice)"), std::string::npos)
        << twice.body;
    Reply nested = Charge("twice-1", R"({"amount":100,"currency":"usd","meta":{"a":1,"a":2}})");
    EXPECT_EQ(nested.status, 400) << nested.body;
    Reply huge = Charge("twice-1", R"({"amount":1e400,"currency":"usd"})");
    EXPECT_EQ(huge.status, 400) << huge.body;
    EXPECT_NE(huge.json().value("detail", "").find("not valid JSON"), std::string::npos) << huge.body;
  }
  // 100,000 nested arrays (200 KB, under the body limit) are refused, and
  // the server lives on.
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  for (int i = 0; i < 2; ++i) EXPECT_EQ(Charge("deep-1", deep).status, 400);
  EXPECT_EQ(Charges().size(), 0u);
  Reply ok = Charge("twice-1", R"({"amount":100,"currency":"usd","meta":{"a":1},"other":{"a":2}})");
  EXPECT_EQ(ok.status, 201) << ok.body;  // the same name in two objects is fine
  EXPECT_TRUE(Charge("twice-1", R"({"amount":100,"currency":"usd","meta":{"a":1},"other":{"a":2}})").replayed());
}

// 401 reads the same on every route: no retry helps.
TEST_P(ProviderTest, UnauthenticatedIsTheSameProblemOnEveryRoute) {
  Start();
  for (int i = 0; i < 2; ++i) {
    Reply post = Charge("auth-2", kBody, "sk_nobody");
    Reply get = Get("/charges", "sk_nobody");
    ASSERT_EQ(post.status, 401);
    ASSERT_EQ(get.status, 401);
    for (const Reply* r : {&post, &get}) {
      EXPECT_EQ(r->json().value("title", ""), "Unauthenticated") << r->body;
      EXPECT_EQ(r->json().value("retry", ""), "no") << r->body;
    }
  }
}

TEST_P(ProviderTest, RequiresABearerAndAKey) {
  Start();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Charge("auth-1", kBody, "sk_nobody").status, 401);
    EXPECT_EQ(Send(provider_->port(), "POST", "/charges", Headers("sk_a", std::nullopt), kBody).status, 400);
    EXPECT_EQ(Send(provider_->port(), "POST", "/charges", Headers("sk_a", "auth 1"), kBody).status, 400);
    EXPECT_EQ(Get("/charges", "sk_nobody").status, 401);
  }
  EXPECT_EQ(Charges().size(), 0u);
  EXPECT_EQ(provider_->counters().executed, 0u);
}

TEST_P(ProviderTest, AHundredConcurrentRequestsWithOneKeyMakeOneCharge) {
  Start();
  constexpr int kThreads = 100;
  std::vector<Reply> replies(kThreads);
  Latch start(kThreads);
  std::vector<std::thread> threads;
  const int port = provider_->port();
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ::httplib::Client c("127.0.0.1", port);  // its own client
      c.set_connection_timeout(std::chrono::seconds(30));
      c.set_read_timeout(std::chrono::seconds(120));
      start.ArriveAndWait();
      replies[i] = ToReply(c.Post("/charges", Headers("sk_a", "\"burst-1\""), kBody, "application/json"));
    });
  }
  for (auto& t : threads) t.join();
  const Reply* first = nullptr;
  int executed = 0, replayed = 0, busy = 0;
  for (const Reply& r : replies) {
    ASSERT_TRUE(r.ok) << r.error;
    if (r.status == 201 && !r.replayed()) {
      ++executed;
      first = &r;
    }
  }
  ASSERT_EQ(executed, 1);
  for (const Reply& r : replies) {
    if (&r == first) continue;
    if (r.status == 409) {
      ++busy;
      EXPECT_FALSE(r.header("Retry-After").empty());
      continue;
    }
    ++replayed;
    EXPECT_TRUE(r.replayed()) << r.status << " " << r.body;
    ExpectSameResponse(*first, r);
  }
  EXPECT_EQ(executed + replayed + busy, kThreads);
  Reply after = Charge("burst-1", kBody);
  EXPECT_TRUE(after.replayed());
  ExpectSameResponse(*first, after);
  auto all = Charges();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].value("id", ""), first->json().value("id", "?"));
  EXPECT_EQ(provider_->counters().executed, 1u);
}

TEST_P(ProviderTest, ALostResponseIsRetriedByTheClientAndReplayed) {
  std::atomic<int> lost{0};
  auto o = Options();
  o.lose_response = [&](const std::string& key) { return key == "lost-1" && lost++ == 0; };
  Start(std::move(o));
  HookedEnv env;
  auto client = http::Client::Open({.base_url = provider_->url(), .bearer = "sk_a", .env = &env});
  ASSERT_TRUE(client.ok()) << client.status();
  auto r = (*client)->Post("/charges", kBody, "lost-1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(lost.load(), 1);
  EXPECT_EQ(r->status, 201);
  EXPECT_TRUE(r->replayed);
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(env.sleeps().size(), 1u);
  auto all = Charges();
  ASSERT_EQ(all.size(), 1u);
  auto body = nlohmann::json::parse(r->body, nullptr, false);
  EXPECT_EQ(body.value("id", ""), all[0].value("id", "?"));
  EXPECT_EQ(r->header("Location"), "/charges/" + all[0].value("id", "?"));
  // The caller retries the whole thing later: still the one charge.
  auto again = (*client)->Post("/charges", kBody, "lost-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->replayed);
  EXPECT_EQ(again->body, r->body);
  EXPECT_EQ(Charges().size(), 1u);
  auto c = provider_->counters();
  EXPECT_EQ(c.executed, 1u);
  EXPECT_EQ(c.replayed, 2u);
}

// Two-phase: a retry takes an expired lease over, and the first request's
// completion is fenced off. In one transaction there is no lease to expire:
// the retry waits for the first request's commit and replays it.
TEST_P(ProviderTest, ATakeoverAfterAnExpiredLeaseMakesOneCharge) {
  Gate gate;
  std::atomic<int> calls{0};
  auto o = Options();
  o.lease_ms = 1;  // runs out while the first request is held below
  o.before_charge = [&](const std::string&) {
    if (calls++ == 0) gate.Arrive();
  };
  Start(std::move(o));
  Reply first;
  std::thread t([&] { first = Charge("lease-1", kBody); });
  gate.WaitArrived();
  if (transactional()) {
    Reply second;
    std::thread t2([&] { second = Charge("lease-1", kBody); });
    gate.Open();
    t.join();
    t2.join();
    ASSERT_TRUE(first.ok && second.ok) << first.error << second.error;
    EXPECT_EQ(first.status, 201) << first.body;
    EXPECT_FALSE(first.replayed());
    EXPECT_EQ(second.status, 201) << second.body;
    EXPECT_TRUE(second.replayed());
    ExpectSameResponse(first, second);
    EXPECT_EQ(calls.load(), 1);
    ASSERT_EQ(Charges().size(), 1u);
    EXPECT_EQ(provider_->counters().executed, 1u);
    return;
  }
  // The first request holds the key until its 1 ms lease is over (on the
  // store's clock); from then on a retry takes the key over.
  Reply second;
  for (int tries = 0; tries < 1'000'000; ++tries) {
    second = Charge("lease-1", kBody);
    if (second.status != 409) break;
  }
  ASSERT_EQ(second.status, 201) << second.body;
  EXPECT_FALSE(second.replayed());
  EXPECT_EQ(calls.load(), 2);
  gate.Open();
  t.join();
  // The first request's completion is fenced off: it answers with the
  // response the takeover stored, and the charge is the takeover's.
  ASSERT_TRUE(first.ok) << first.error;
  EXPECT_EQ(first.status, 201);
  EXPECT_TRUE(first.replayed());
  ExpectSameResponse(second, first);
  Reply third = Charge("lease-1", kBody);
  EXPECT_TRUE(third.replayed());
  ExpectSameResponse(second, third);
  auto all = Charges();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].value("id", ""), second.json().value("id", "?"));
  EXPECT_EQ(provider_->counters().executed, 2u);
}

}  // namespace
}  // namespace idem::testing
