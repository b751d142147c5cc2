// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::pubsub without the emulator: URLs, how a pulled message is read
// (src/pubsub/wire.h), where calls go and with which token, and the REST
// caller (src/pubsub/rest.h) against a tiny local HTTP server that answers
// as the Pub/Sub service documents its errors (429 RESOURCE_EXHAUSTED, 503
// UNAVAILABLE, 401 UNAUTHENTICATED): answers the emulator never gives.
#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "idem/pubsub/publisher.h"
#include "idem/pubsub/source.h"
#include "pubsub/rest.h"
#include "pubsub/wire.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using pubsub_internal::DecodeReceived;

TEST(PubsubUrl, SourceUrl) {
  auto o = pubsub::Source::ParseUrl(
      "pubsub://shop/payments?endpoint=http://127.0.0.1:8085&topic=orders&create=true&exactly_once=true"
      "&lease_ms=20000&id_fallback=false");
  ASSERT_OK(o);
  EXPECT_EQ(o->connection.project, "shop");
  EXPECT_EQ(o->subscription, "payments");
  EXPECT_EQ(o->connection.endpoint, "http://127.0.0.1:8085");
  EXPECT_EQ(o->topic, "orders");
  EXPECT_TRUE(o->create);
  EXPECT_TRUE(o->exactly_once);
  EXPECT_EQ(o->lease_ms, 20'000);
  EXPECT_FALSE(o->id_fallback);
}

TEST(PubsubUrl, BadSourceUrls) {
  for (const char* url :
       {"pubsub://shop", "pubsub://shop/a/b", "pubsub://shop/payments?nope=1", "pubsub://shop/payments?lease_ms=5",
        "pubsub://shop:80/payments", "kafka://shop/payments", "pubsub://u:secret@shop/payments"}) {
    auto o = pubsub::Source::ParseUrl(url);
    ASSERT_FALSE(o.ok()) << url;
    EXPECT_EQ(o.status().code(), Code::kInvalidArgument) << url;
    EXPECT_EQ(o.status().message().find("secret"), std::string::npos) << o.status();
  }
}

TEST(PubsubUrl, PublisherUrlIsTheSourceUrlWithATopic) {
  auto p = pubsub::Publisher::ParseUrl("pubsub://shop/payments?topic=orders&ordering_key=k&max_batch=10");
  ASSERT_OK(p);
  EXPECT_EQ(p->connection.project, "shop");
  EXPECT_EQ(p->topic, "orders");
  EXPECT_EQ(p->ordering_key, "k");
  EXPECT_EQ(p->max_batch, 10);
  auto bare = pubsub::Publisher::ParseUrl("pubsub://shop?topic=orders");
  ASSERT_OK(bare);
  EXPECT_EQ(bare->topic, "orders");
}

nlohmann::json Received(nlohmann::json attributes, std::string data = "aGVsbG8=") {
  nlohmann::json m = {{"messageId", "1234"}, {"attributes", std::move(attributes)}};
  if (!data.empty()) m["data"] = data;
  return {{"ackId", "ack-1"}, {"message", m}, {"deliveryAttempt", 3}};
}

constexpr pubsub_internal::DecodeSettings kSettings{
    .subscription = "projects/p/subscriptions/s", .id_attribute = "idem-id", .id_fallback = true};

TEST(PubsubWire, AMessageAsIdemPublishesIt) {
  Delivery d = DecodeReceived(Received({{"idem-id", "order-1"},
                                        {"idem-producer-time-ms", "1700000000000"},
                                        {"trace", "abc"},
                                        {"idem-b64:bin", "AAH+/w=="}}),
                              kSettings);
  EXPECT_EQ(d.receipt, "ack-1");
  EXPECT_EQ(d.message.id, "order-1");
  EXPECT_EQ(d.message.payload, "hello");
  EXPECT_EQ(d.message.attempt, 3);
  EXPECT_EQ(d.message.producer_time_ms, 1'700'000'000'000);
  EXPECT_EQ(d.message.Header("trace"), std::optional<std::string_view>("abc"));
  EXPECT_EQ(d.message.Header("bin"), std::optional<std::string_view>(std::string("\0\x01\xfe\xff", 4)));
  EXPECT_FALSE(d.message.Header(pubsub::kErrorHeader).has_value());
}

TEST(PubsubWire, WithoutTheIdAttributeTheMessageIdIsTheDocumentedFallback) {
  Delivery d = DecodeReceived(Received({{"other", "x"}}), kSettings);
  EXPECT_EQ(d.message.id, "1234");
  auto strict = kSettings;
  strict.id_fallback = false;
  Delivery e = DecodeReceived(Received({{"other", "x"}}), strict);
  EXPECT_TRUE(e.message.id.empty());
  ASSERT_TRUE(e.message.Header(pubsub::kErrorHeader).has_value());
  EXPECT_NE(e.message.Header(pubsub::kErrorHeader)->find("'idem-id'"), std::string_view::npos);
}

TEST(PubsubWire, MalformedMessagesCarryTheirErrorAndAnEmptyId) {
  for (const nlohmann::json& bad :
       {Received({{"idem-id", "a"}}, "not base64!"), Received({{"idem-id", std::string(300, 'x')}}),
        Received({{"idem-b64:idem-id", "***"}})}) {
    Delivery d = DecodeReceived(bad, kSettings);
    EXPECT_TRUE(d.message.id.empty()) << bad.dump();
    EXPECT_TRUE(d.message.Header(pubsub::kErrorHeader).has_value()) << bad.dump();
    EXPECT_EQ(d.receipt, "ack-1");
  }
  Delivery empty = DecodeReceived(Received({{"idem-id", "a"}}, ""), kSettings);
  EXPECT_EQ(empty.message.id, "a");
  EXPECT_EQ(empty.message.payload, "");
  Delivery no_attempt = DecodeReceived({{"ackId", "x"}, {"message", {{"attributes", {{"idem-id", "a"}}}}}}, kSettings);
  EXPECT_EQ(no_attempt.message.attempt, 0) << "no dead-letter policy: the service does not count";
}

TEST(PubsubWire, TheOrderingKeyIsAHeader) {
  nlohmann::json r = Received({{"idem-id", "a"}});
  r["message"]["orderingKey"] = "acct-9";
  Delivery d = DecodeReceived(r, kSettings);
  EXPECT_EQ(d.message.Header(kOrderingKeyHeader), std::optional<std::string_view>("acct-9"));
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old, had_ = true;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(PubsubEndpoint, ExplicitThenEmulatorHostThenTheServiceWithAToken) {
  ScopedEnv host("PUBSUB_EMULATOR_HOST", "127.0.0.1:9999");
  ScopedEnv token("GOOGLE_OAUTH_ACCESS_TOKEN", nullptr);
  ScopedEnv file("GOOGLE_OAUTH_ACCESS_TOKEN_FILE", nullptr);
  auto given = pubsub_internal::FindEndpoint("http://127.0.0.1:1234", "", "");
  ASSERT_OK(given);
  EXPECT_EQ(given->url, "http://127.0.0.1:1234");
  auto emulator = pubsub_internal::FindEndpoint("", "", "");
  ASSERT_OK(emulator);
  EXPECT_EQ(emulator->url, "http://127.0.0.1:9999");
  EXPECT_TRUE(emulator->bearer.empty());
  {
    ScopedEnv none("PUBSUB_EMULATOR_HOST", nullptr);
    auto missing = pubsub_internal::FindEndpoint("", "", "");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), Code::kInvalidArgument);
    EXPECT_NE(missing.status().message().find("GOOGLE_OAUTH_ACCESS_TOKEN"), std::string::npos);
    ScopedEnv set("GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.secret-token");
    auto service = pubsub_internal::FindEndpoint("", "", "");
    ASSERT_OK(service);
    EXPECT_EQ(service->url, "https://pubsub.googleapis.com");
    EXPECT_EQ(service->bearer, "ya29.secret-token");
  }
  TempDir dir;
  auto unreadable = pubsub_internal::FindEndpoint("", "", dir.File("absent"));
  EXPECT_EQ(unreadable.status().code(), Code::kInvalidArgument);
}

// A local server answering as the service: the handler decides per request.
class FakeService {
 public:
  explicit FakeService(std::function<void(const httplib::Request&, httplib::Response&)> answer) {
    server_.Post(".*", [this, answer](const httplib::Request& q, httplib::Response& r) {
      ++requests;
      authorization = q.get_header_value("Authorization");
      answer(q, r);
    });
    server_.Get(".*", [this, answer](const httplib::Request& q, httplib::Response& r) {
      ++requests;
      authorization = q.get_header_value("Authorization");
      answer(q, r);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeService() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::atomic<int> requests{0};
  std::string authorization;

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

void Error(httplib::Response& r, int code, const char* status, const char* message) {
  r.status = code;
  r.set_content(nlohmann::json{{"error", {{"code", code}, {"message", message}, {"status", status}}}}.dump(),
                "application/json");
}

Result<std::unique_ptr<pubsub_internal::RestClient>> Client(const std::string& url, int attempts,
                                                            std::string token = "") {
  return pubsub_internal::RestClient::Open({.endpoint = {.url = url, .bearer = std::move(token)},
                                            .max_attempts = attempts,
                                            .backoff_base_ms = 1,
                                            .backoff_max_ms = 5});
}

TEST(PubsubRest, ThrottlingIsRetriedWithinTheBound) {
  FakeService svc([&](const httplib::Request&, httplib::Response& r) {
    static std::atomic<int> n{0};
    if (++n <= 2) return Error(r, 429, "RESOURCE_EXHAUSTED", "quota");
    r.set_content(R"({"receivedMessages":[]})", "application/json");
  });
  auto c = Client(svc.url(), 5);
  ASSERT_OK(c);
  const nlohmann::json body = {{"maxMessages", 1}};
  auto r = (*c)->Call("POST", "/v1/projects/p/subscriptions/s:pull", &body);
  ASSERT_OK(r);
  EXPECT_FALSE(r->error.has_value());
  EXPECT_EQ(r->attempts, 3);
  EXPECT_EQ(svc.requests.load(), 3);
}

TEST(PubsubRest, AnUnavailableServiceIsTriedMaxAttemptsTimesThenUnavailable) {
  FakeService svc([](const httplib::Request&, httplib::Response& r) { Error(r, 503, "UNAVAILABLE", "down"); });
  auto c = Client(svc.url(), 3);
  ASSERT_OK(c);
  auto r = (*c)->Call("POST", "/v1/projects/p/subscriptions/s:acknowledge", nullptr);
  ASSERT_OK(r);
  ASSERT_TRUE(r->error.has_value());
  EXPECT_EQ(svc.requests.load(), 3);
  EXPECT_EQ(pubsub_internal::ToStatus(*r->error, "ack").code(), Code::kUnavailable);
}

// A refused token: a clear error, not retried, the token never printed; and
// the source acknowledges nothing (Open fails).
TEST(PubsubRest, ARefusedTokenIsAClearErrorWithoutTheToken) {
  FakeService svc([](const httplib::Request&, httplib::Response& r) {
    Error(r, 401, "UNAUTHENTICATED", "Request had invalid authentication credentials.");
  });
  auto s = pubsub::Source::Open(
      {.connection = {.project = "p", .endpoint = svc.url(), .access_token = "ya29.hidden"}, .subscription = "subs"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("access token was refused"), std::string::npos) << s.status();
  EXPECT_EQ(s.status().message().find("ya29.hidden"), std::string::npos) << s.status();
  EXPECT_EQ(svc.authorization, "Bearer ya29.hidden");
  EXPECT_EQ(svc.requests.load(), 1);
}

}  // namespace
}  // namespace idem::testing
