// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::sqs on the fixture "sqs" (fauxqs on the real clock): long polling,
// leases kept by ExtendLease and lost, FIFO order per group, messages from a
// producer that is not idem's, opening by URL, and bad input (a missing
// queue, a wrong region, an unreachable endpoint). Throttling and the errors
// only the real service gives come from a tiny local HTTP server that
// answers with SQS's documented error documents (fauxqs never throttles);
// the test says so where it uses it.
#include <httplib.h>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "idem/consumer.h"
#include "idem/inbox.h"
#include "idem/open.h"
#include "idem/sqlite/store.h"
#include "idem/sqs/source.h"
#include "sqs/sqs_test_util.h"
#include "util/temp_dir.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using std::chrono::milliseconds;

class SqsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    endpoint_ = SqsEndpoint();
    queue_ = SqsQueueName(UniqueServerName("q-"));
    ASSERT_TRUE(CreateSqsQueue(endpoint_, queue_).ok());
  }
  std::unique_ptr<sqs::Source> OpenSource(int64_t lease_ms = 30'000, const std::string& queue = "") {
    auto s = sqs::Source::Open(
        {.queue = queue.empty() ? queue_ : queue, .connect = SqsConnect(endpoint_), .lease_ms = lease_ms});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::unique_ptr<sqs::Publisher> OpenPublisher(const std::string& queue = "") {
    auto p = sqs::Publisher::Open({.queue = queue.empty() ? queue_ : queue, .connect = SqsConnect(endpoint_)});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }
  // Everything visible now (SQS: at most 10 per call).
  static std::vector<Delivery> Drain(Source& s) {
    std::vector<Delivery> out;
    for (;;) {
      auto got = s.Receive(10, 0);
      EXPECT_TRUE(got.ok()) << got.status();
      if (!got.ok() || got->empty()) return out;
      for (Delivery& d : *got) out.push_back(std::move(d));
    }
  }

  TempDir dir_;
  std::string endpoint_;
  std::string queue_;
};

TEST_F(SqsTest, ALongPollWakesWhenAMessageArrives) {
  auto src = OpenSource();
  auto pub = OpenPublisher();
  ASSERT_TRUE(src && pub);
  std::thread producer([&] {
    std::this_thread::sleep_for(milliseconds(300));
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(pub->Publish(Msg("late")).ok());
  });
  auto got = src->Receive(10, 15'000);  // long polling (WaitTimeSeconds 15)
  producer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_FALSE(got->empty());
  EXPECT_EQ((*got)[0].message.id, "late");
  EXPECT_EQ((*got)[0].message.attempt, 1);
  std::vector<Delivery> all = *got;
  for (Delivery& d : Drain(*src)) all.push_back(std::move(d));
  ASSERT_EQ(all.size(), 2u);
  for (const Delivery& d : all) EXPECT_TRUE(src->Ack(d).ok());
  EXPECT_TRUE(Drain(*src).empty());
}

// A handler that runs past the visibility timeout keeps its message: the
// Consumer's lease keeper extends it (ChangeMessageVisibility) every third
// of the lease, and another receiver polling meanwhile never gets it.
TEST_F(SqsTest, AHandlerRunningPastTheVisibilityTimeoutKeepsItsMessageByExtendLease) {
  auto src = OpenSource(/*lease_ms=*/1'000);
  auto other = OpenSource(/*lease_ms=*/1'000);
  auto pub = OpenPublisher();
  ASSERT_TRUE(src && other && pub);
  ASSERT_TRUE(pub->Publish(Msg("slow")).ok());
  auto store = sqlite::Store::Open({.path = dir_.File("store.db")});
  ASSERT_OK(store);
  ASSERT_TRUE(CreatePayments(**store).ok());
  auto inbox = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "sqs-lease"});
  std::atomic<bool> running{false}, done{false};
  Handler charge = ChargeHandler();
  auto consumer = MustOpen<Consumer>(*src, *inbox, Handler([&](Transaction& tx, const Message& m) {
    running = true;
    // Three visibility timeouts.
    std::this_thread::sleep_for(milliseconds(3'000));
    return charge(tx, m);
  }),
                                     Consumer::Options{.receive_wait_ms = 100, .stop_when_idle = true});
  std::vector<std::string> stolen;
  std::thread thief([&] {
    while (!running) std::this_thread::sleep_for(milliseconds(10));
    while (!done) {
      auto got = other->Receive(10, 0);
      if (got.ok())
        for (const Delivery& d : *got) stolen.push_back(d.message.id);
      std::this_thread::sleep_for(milliseconds(50));
    }
  });
  Status run = consumer->Run();
  done = true;
  thief.join();
  ASSERT_TRUE(run.ok()) << run;
  EXPECT_TRUE(stolen.empty()) << "another receiver got '" << stolen.front() << "' while its handler ran";
  EXPECT_GE(consumer->stats().leases_extended, 1u);
  EXPECT_EQ(consumer->stats().lease_extension_errors, 0u);
  EXPECT_EQ(Charges(**store, "slow"), 1);
  std::this_thread::sleep_for(milliseconds(1'200));  // past any lease: nothing comes back (it was deleted)
  EXPECT_TRUE(Drain(*other).empty());
}

// A delivery whose lease ran out is received again (attempt 2). The old
// receipt handle: ExtendLease and Nack are kLeaseLost; Ack (DeleteMessage
// with it) is OK as SQS answers, but does not delete on fauxqs (nor,
// documentedly, always on SQS): the message comes again, and the Inbox
// absorbs the second delivery. The effect happens once.
TEST_F(SqsTest, ADeliveryWhoseLeaseWasLostIsRedeliveredAndAbsorbedByTheInbox) {
  auto src = OpenSource(/*lease_ms=*/1'000);
  auto pub = OpenPublisher();
  ASSERT_TRUE(src && pub);
  ASSERT_TRUE(pub->Publish(Msg("m-1")).ok());
  auto store = sqlite::Store::Open({.path = dir_.File("store.db")});
  ASSERT_OK(store);
  ASSERT_TRUE(CreatePayments(**store).ok());
  auto inbox = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "sqs-lost"});

  auto first = src->Receive(1, 0);
  ASSERT_TRUE(first.ok() && first->size() == 1u);
  const Delivery stale = (*first)[0];
  EXPECT_EQ(stale.message.attempt, 1);
  EXPECT_TRUE(inbox->Handle(stale.message, ChargeHandler()).applied());
  std::this_thread::sleep_for(milliseconds(1'300));  // the lease runs out before the ack
  auto second = src->Receive(1, 5'000);
  ASSERT_TRUE(second.ok() && second->size() == 1u);
  const Delivery fresh = (*second)[0];
  EXPECT_EQ(fresh.message.id, "m-1");
  EXPECT_EQ(fresh.message.attempt, 2);

  EXPECT_EQ(src->ExtendLease(stale).code(), Code::kLeaseLost);
  EXPECT_EQ(src->Nack(stale, 0).code(), Code::kLeaseLost);
  EXPECT_TRUE(src->Ack(stale).ok());  // SQS answers success to an outdated handle
  // ... and the fresh delivery is untouched: still leased, extendable.
  EXPECT_TRUE(src->ExtendLease(fresh).ok());
  EXPECT_TRUE(Drain(*src).empty());

  Outcome again = inbox->Handle(fresh.message, ChargeHandler());
  EXPECT_EQ(again.kind, Outcome::Kind::kDuplicate);
  EXPECT_TRUE(src->Ack(fresh).ok());
  EXPECT_EQ(Charges(**store, "m-1"), 1);
  EXPECT_EQ(src->ExtendLease(fresh).code(), Code::kLeaseLost) << "deleted: no longer in flight";
}

// Acks from many threads at once (more than go out as single calls): every
// one answered OK and every message deleted: none comes back after the
// visibility timeout.
TEST_F(SqsTest, ManyConcurrentAcksEachTakeEffect) {
  auto src = OpenSource(/*lease_ms=*/1'000);
  auto pub = OpenPublisher();
  ASSERT_TRUE(src && pub);
  std::vector<Message> msgs;
  for (int i = 0; i < 40; ++i) msgs.push_back(Msg("c-" + std::to_string(i)));
  std::vector<Outgoing> batch;
  for (const Message& m : msgs) batch.push_back({{}, {}, &m});
  for (int round = 0; round < 2; ++round)
    for (const Status& s : pub->PublishBatch(batch)) ASSERT_TRUE(s.ok()) << s;
  std::vector<Delivery> got = Drain(*src);
  ASSERT_EQ(got.size(), 80u);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (const Delivery& d : got)
    threads.emplace_back([&, d] {
      if (src->Ack(d).ok()) ++ok;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 80);
  std::this_thread::sleep_for(milliseconds(1'300));  // past the visibility timeout
  EXPECT_TRUE(Drain(*src).empty()) << "an acked message came back";
}

// FIFO: a group's messages come in the order they were sent, one group's
// next message only after the one before was acknowledged; a copy sent again
// within SQS's deduplication window (same id) is dropped by SQS.
TEST_F(SqsTest, FifoKeepsEachGroupsOrderAndDeduplicatesByMessageId) {
  const std::string q = SqsQueueName(UniqueServerName("f-"), /*fifo=*/true);
  ASSERT_TRUE(CreateSqsQueue(endpoint_, q).ok());
  auto src = OpenSource(30'000, q);
  auto pub = OpenPublisher(q);
  ASSERT_TRUE(src && pub);
  EXPECT_TRUE(src->fifo());
  std::vector<Message> msgs;
  for (int i = 0; i < 12; ++i) msgs.push_back(Msg("o-" + std::to_string(i), std::to_string(i)));
  std::vector<Outgoing> batch;
  for (int i = 0; i < 12; ++i) batch.push_back({{}, i % 2 ? "odd" : "even", &msgs[static_cast<size_t>(i)]});
  for (int round = 0; round < 2; ++round)
    for (const Status& s : pub->PublishBatch(batch)) EXPECT_TRUE(s.ok()) << s;
  std::map<std::string, std::vector<int>> order;
  for (int rounds = 0; rounds < 100; ++rounds) {
    std::vector<Delivery> got = Drain(*src);
    if (got.empty()) break;
    for (const Delivery& d : got) {
      order[std::string(*d.message.Header(kOrderingKeyHeader))].push_back(std::stoi(d.message.payload));
      EXPECT_TRUE(src->Ack(d).ok());
    }
  }
  EXPECT_EQ(order["even"], (std::vector<int>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(order["odd"], (std::vector<int>{1, 3, 5, 7, 9, 11}));
}

// A message from a producer that is not idem's: SQS's MessageId is the id
// (the documented fallback), its attributes are headers; without the
// fallback the id is empty and idem-error says why (dead-lettered).
TEST_F(SqsTest, AMessageWithoutTheIdAttributeGetsSqsMessageIdOrAnError) {
  auto client = aws_internal::JsonClient::Open(
      {.signing_name = "sqs", .target_prefix = "AmazonSQS", .content_type = "application/x-amz-json-1.0"},
      {.region = "us-east-1",
       .endpoint = endpoint_,
       .credentials = {.access_key_id = "AKIDIDEMTEST", .secret_access_key = "idem-test-secret"}});
  ASSERT_OK(client);
  auto src = OpenSource();
  ASSERT_TRUE(src);
  for (int i = 0; i < 2; ++i) {
    auto r = (*client)->Call("SendMessage",
                             {{"QueueUrl", src->queue_url()},
                              {"MessageBody", "plain body"},
                              {"MessageAttributes", {{"tenant", {{"DataType", "String"}, {"StringValue", "acme"}}}}}});
    ASSERT_TRUE(r.ok() && !r->error);
  }
  std::vector<Delivery> got = Drain(*src);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_FALSE(got[0].message.id.empty());
  EXPECT_NE(got[0].message.id, got[1].message.id) << "two sends, two MessageIds";
  EXPECT_EQ(got[0].message.payload, "plain body");
  EXPECT_EQ(got[0].message.Header("tenant"), std::optional<std::string_view>("acme"));
  for (const Delivery& d : got) ASSERT_TRUE(src->Nack(d, 0).ok());
  auto strict = sqs::Source::Open({.queue = queue_, .connect = SqsConnect(endpoint_), .message_id_fallback = false});
  ASSERT_OK(strict);
  std::vector<Delivery> again = Drain(**strict);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_TRUE(again[0].message.id.empty());
  ASSERT_TRUE(again[0].message.Header("idem-error").has_value());
  EXPECT_NE(again[0].message.Header("idem-error")->find("idem-id"), std::string_view::npos);
  EXPECT_EQ(again[0].message.attempt, 2);
}

TEST_F(SqsTest, OpenSourceAndOpenPublisherTakeTheSqsUrl) {
  // A URL carries no credentials: the environment's (the emulator checks
  // no signature).
  ::setenv("AWS_ACCESS_KEY_ID", "AKIDIDEMTEST", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "idem-test-secret", 1);
  const std::string url = "sqs://" + queue_ + "?region=us-east-1&endpoint=" + endpoint_ + "&lease_ms=5000";
  auto p = idem::OpenPublisher(url);
  ASSERT_OK(p);
  EXPECT_EQ((*p)->Kind(), "sqs");
  ASSERT_TRUE((*p)->Publish(Msg("by-url")).ok());
  ASSERT_TRUE((*p)->Publish(Msg("by-url")).ok());
  auto s = idem::OpenSource(url, {});
  ASSERT_OK(s);
  EXPECT_EQ((*s)->lease_ms(), 5'000);
  std::vector<Delivery> got = Drain(**s);
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.id, "by-url");
    EXPECT_TRUE((*s)->Ack(d).ok());
  }
}

// --- bad input -------------------------------------------------------------

TEST_F(SqsTest, AMissingQueueIsNotFoundAtOpen) {
  auto s = sqs::Source::Open({.queue = "no-such-queue-" + queue_, .connect = SqsConnect(endpoint_)});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kNotFound) << s.status();
  EXPECT_NE(s.status().message().find("no-such-queue-"), std::string::npos) << s.status();
  auto p = sqs::Publisher::Open({.queue = "no-such-queue-" + queue_, .connect = SqsConnect(endpoint_)});
  EXPECT_EQ(p.status().code(), Code::kNotFound) << p.status();
}

// The queue exists in us-east-1: in eu-west-1 it does not (SQS queues are
// regional; fauxqs reads the region from the signature's scope).
TEST_F(SqsTest, AWrongRegionIsNotFoundNamingTheRegion) {
  sqs::ConnectOptions c = SqsConnect(endpoint_);
  c.region = "eu-west-1";
  auto s = sqs::Source::Open({.queue = queue_, .connect = c});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kNotFound) << s.status();
  EXPECT_NE(s.status().message().find("eu-west-1"), std::string::npos) << s.status();
  c.region = "Not A Region";
  EXPECT_EQ(sqs::Source::Open({.queue = queue_, .connect = c}).status().code(), Code::kInvalidArgument);
}

TEST_F(SqsTest, AnUnreachableEndpointIsUnavailableAtOpen) {
  sqs::ConnectOptions c = SqsConnect("http://127.0.0.1:1");
  c.max_attempts = 2;
  auto s = sqs::Source::Open({.queue = queue_, .connect = c});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable) << s.status();
  EXPECT_NE(s.status().message().find("127.0.0.1:1"), std::string::npos) << s.status();
  EXPECT_EQ(s.status().message().find(c.secret_access_key), std::string::npos) << "the secret is never printed";
}

TEST_F(SqsTest, NoCredentialsIsAClearErrorAtOpen) {
  sqs::ConnectOptions c = SqsConnect(endpoint_);
  c.access_key_id = "AKIDONLY";
  c.secret_access_key.clear();
  auto s = sqs::Source::Open({.queue = queue_, .connect = c});
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("secret"), std::string::npos) << "says what is missing: " << s.status();
}

// A stand-in for SQS that throttles: fauxqs never does. It answers
// GetQueueUrl and GetQueueAttributes (so Open works), and every other call
// with SQS's documented throttling error (HTTP 400, __type
// ...#ThrottlingException), counting the calls.
class ThrottlingSqs {
 public:
  ThrottlingSqs() {
    server_.Post("/", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string target = req.get_header_value("X-Amz-Target");
      if (target == "AmazonSQS.GetQueueUrl") {
        res.set_content(R"({"QueueUrl":"http://127.0.0.1/000000000000/busy"})", "application/x-amz-json-1.0");
        return;
      }
      if (target == "AmazonSQS.GetQueueAttributes") {
        res.set_content(R"({"Attributes":{"FifoQueue":"false"}})", "application/x-amz-json-1.0");
        return;
      }
      ++calls_;
      res.status = 400;
      res.set_content(R"({"__type":"com.amazonaws.sqs#ThrottlingException","message":"Rate exceeded"})",
                      "application/x-amz-json-1.0");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(milliseconds(1));
  }
  ~ThrottlingSqs() {
    server_.stop();
    thread_.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int calls() const { return calls_; }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> calls_{0};
};

// An endpoint that answers HTTP but is not SQS (a web server's 404 page):
// a clear error at Open naming the endpoint, not a hang or a crash.
TEST(SqsWrongEndpointTest, AnEndpointThatIsNotSqsIsAClearErrorAtOpen) {
  httplib::Server web;
  web.Post("/", [](const httplib::Request&, httplib::Response& res) {
    res.status = 404;
    res.set_content("<html><body>Not Found</body></html>", "text/html");
  });
  const int port = web.bind_to_any_port("127.0.0.1");
  std::thread t([&] { web.listen_after_bind(); });
  while (!web.is_running()) std::this_thread::sleep_for(milliseconds(1));
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(port);
  auto s = sqs::Source::Open({.queue = "q", .connect = SqsConnect(endpoint)});
  web.stop();
  t.join();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find(endpoint), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("404"), std::string::npos) << s.status();
}

// Throttled: a bounded number of tries (max_attempts), then kBusy naming the
// throttling; an Ack that was throttled is an error, never OK.
TEST(SqsThrottlingTest, AThrottledCallIsRetriedABoundedNumberOfTimesThenBusyAndNeverAcked) {
  ThrottlingSqs busy;
  sqs::ConnectOptions c = SqsConnect(busy.endpoint());
  c.max_attempts = 3;
  auto s = sqs::Source::Open({.queue = "busy", .connect = c});
  ASSERT_OK(s);
  auto got = (*s)->Receive(10, 0);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kBusy) << got.status();
  EXPECT_NE(got.status().message().find("ThrottlingException"), std::string::npos) << got.status();
  EXPECT_EQ(busy.calls(), 3);
  Delivery d;
  d.message = Msg("m-1");
  d.receipt = "receipt-1";
  Status ack = (*s)->Ack(d);
  EXPECT_EQ(ack.code(), Code::kBusy) << ack;
  EXPECT_EQ(busy.calls(), 6);
  auto p = sqs::Publisher::Open({.queue = "busy", .connect = c});
  ASSERT_OK(p);
  EXPECT_EQ((*p)->Publish(Msg("m-1")).code(), Code::kBusy);
}

}  // namespace
}  // namespace idem::testing
