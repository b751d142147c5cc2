// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::dynamodb on DynamoDB Local (the CTest fixture "dynamodb"): the store
// and claims conformance suites, and what is the store's own: items written
// with the marker in one TransactWriteItems, the 100-write limit, a
// condition that fails, no SQL, a missing table, a wrong endpoint,
// throttling and a lost answer (tiny local HTTP servers, said so below).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "aws/client.h"
#include "dynamodb/ddb.h"
#include "idem/dynamodb/items.h"
#include "idem/dynamodb/store.h"
#include "idem/inbox.h"
#include "idem/open.h"
#include "idem/sqlite/store.h"
#include "idem/testing/harness.h"
#include "idem/url.h"
#include "util/claims_conformance.h"
#include "util/store_conformance.h"
#include "util/test_servers.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using dynamodb::Attr;
using dynamodb::ItemsOf;
using nlohmann::json;

std::string Endpoint() { return FixtureServerUrl("dynamodb", "http://127.0.0.1:1"); }

dynamodb::Store::Options Options(const std::string& table, Env* env = nullptr) {
  dynamodb::Store::Options o;
  o.table = table;
  o.region = "us-east-1";
  o.endpoint = Endpoint();
  o.access_key_id = "idemtest";
  o.secret_access_key = "idemtest-secret";
  o.env = env;
  o.claim_clock = env;
  return o;
}

// A table name of this test's own: `dir` names it in this process and in
// forked ones.
std::string TableFor(const TempDir& dir) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016zx", std::hash<std::string>{}(dir.File("dynamodb")));
  return std::string("idem-") + hex;
}

// The suite's own client, for the payments table (no idem code between).
aws_internal::JsonClient& Client() {
  static std::unique_ptr<aws_internal::JsonClient> client = [] {
    aws_internal::ClientOptions o;
    o.region = "us-east-1";
    o.endpoint = Endpoint();
    o.credentials = {"idemtest", "idemtest-secret", ""};
    auto c = aws_internal::JsonClient::Open({"dynamodb", "DynamoDB_20120810", "application/x-amz-json-1.0"}, o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }();
  return *client;
}

json Call(std::string_view op, const json& in) {
  auto r = Client().Call(op, in);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return json();
  EXPECT_FALSE(r->error.has_value()) << op << ": " << r->error->type << " " << r->error->message;
  return r->body;
}

// The payments of the suite's example, as items: key (message_id, charge),
// one new charge id per write, so a repeated effect is a second item.
std::string g_payments;  // the current test's payments table (set by its open)

Status CreatePaymentsTable(Store&) {
  auto r = Client().Call(
      "CreateTable",
      {{"TableName", g_payments},
       {"AttributeDefinitions",
        {{{"AttributeName", "message_id"}, {"AttributeType", "S"}},
         {{"AttributeName", "charge"}, {"AttributeType", "S"}}}},
       {"KeySchema",
        {{{"AttributeName", "message_id"}, {"KeyType", "HASH"}}, {{"AttributeName", "charge"}, {"KeyType", "RANGE"}}}},
       {"BillingMode", "PAY_PER_REQUEST"}});
  if (!r.ok()) return r.status();
  if (r->error && r->error->type != "ResourceInUseException") return Status::Internal(r->error->message);
  return Status::OK();
}

Status Pay(Transaction& tx, const std::string& message_id, int64_t cents) {
  static std::atomic<uint64_t> n{std::random_device{}()};
  return ItemsOf(tx).Put(g_payments, {{"message_id", Attr::S(message_id)},
                                      {"charge", Attr::S(std::to_string(::getpid()) + "-" + std::to_string(n++))},
                                      {"cents", Attr::N(cents)}});
}

int64_t CountPayments(Store&, const std::string& id) {
  json in = {{"TableName", g_payments}, {"Select", "COUNT"}, {"ConsistentRead", true}};
  if (!id.empty()) {
    in["KeyConditionExpression"] = "message_id = :id";
    in["ExpressionAttributeValues"] = {{":id", {{"S", id}}}};
  }
  int64_t total = 0;
  for (;;) {
    json r = Call(id.empty() ? "Scan" : "Query", in);
    if (r.is_null()) return -1;
    total += r.value("Count", 0);
    if (!r.contains("LastEvaluatedKey")) return total;
    in["ExclusiveStartKey"] = r["LastEvaluatedKey"];
  }
}

Result<std::unique_ptr<Store>> OpenFor(const TempDir& dir, Env* env) {
  const std::string table = TableFor(dir);
  g_payments = table + "-payments";
  return dynamodb::Store::Open(Options(table, env));
}

}  // namespace

// DynamoDB runs no SQL: SqlStoreConformance is not for it.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(SqlStoreConformance);
INSTANTIATE_TEST_SUITE_P(Stores, StoreConformance,
                         ::testing::Values(StoreParam{"dynamodb", OpenFor,
                                                      Payments{CreatePaymentsTable, Pay, CountPayments}}),
                         StoreParamName);

INSTANTIATE_TEST_SUITE_P(Stores, ClaimsConformance,
                         ::testing::Values(ClaimsParam{
                             "dynamodb", [](const TempDir& d, Env* env) { return ClaimsOf(OpenFor(d, env)); }}),
                         ClaimsParamName);

namespace {

class DynamoDbStore : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = OpenFor(dir_, &env_);
    ASSERT_OK(s);
    store_ = std::move(*s);
    Store& store = *store_;
    ASSERT_OK(CreatePaymentsTable(store));
  }
  Inbox& MakeInbox() {
    inbox_ = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
    return *inbox_;
  }
  TempDir dir_;
  FakeEnv env_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Inbox> inbox_;
};

// SQL is refused, saying what to use instead; nothing is written.
TEST_F(DynamoDbStore, SqlIsRefusedNamingItemsOf) {
  Inbox& inbox = MakeInbox();
  for (int round = 0; round < 2; ++round) {
    Outcome o = inbox.Handle(Msg("m-sql"), [](Transaction& tx, const Message&) -> Status {
      return tx.Exec("INSERT INTO payments VALUES (1)").status();
    });
    EXPECT_EQ(o.kind, Outcome::Kind::kFailed);
    EXPECT_NE(o.status.message().find("ItemsOf"), std::string::npos) << o.status;
  }
  EXPECT_FALSE(store_->FindMarker("payments", "m-sql")->has_value());
}

// ItemsOf on another store's transaction: every call fails, saying so.
TEST_F(DynamoDbStore, ItemsOfAnotherStoresTransactionRefuses) {
  auto sqlite = sqlite::Store::Open({.path = dir_.File("other.db")});
  ASSERT_OK(sqlite);
  auto tx = (*sqlite)->Begin();
  ASSERT_OK(tx);
  Status s = ItemsOf(**tx).Put("t", {{"k", Attr::S("v")}});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("not a DynamoDB"), std::string::npos) << s;
}

// The handler's items and the marker commit together; a redelivery is a
// duplicate; Get reads committed items.
TEST_F(DynamoDbStore, ItemsCommitWithTheMarkerAndGetReadsThem) {
  Inbox& inbox = MakeInbox();
  Handler h = [](Transaction& tx, const Message& m) -> Status {
    dynamodb::Items& items = ItemsOf(tx);
    IDEM_RETURN_IF_ERROR(Pay(tx, m.id, 4000));
    IDEM_RETURN_IF_ERROR(items.Update(g_payments, {{"message_id", Attr::S("totals")}, {"charge", Attr::S("all")}},
                                      "ADD cents :c", {.values = {{":c", Attr::N(4000)}}}));
    return Status::OK();
  };
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 3; ++i) {
      Outcome o = inbox.Handle(Msg("m-" + std::to_string(i)), h);
      EXPECT_EQ(o.kind, round == 0 ? Outcome::Kind::kApplied : Outcome::Kind::kDuplicate) << o.ToString();
    }
  }
  auto tx = store_->Begin();
  ASSERT_OK(tx);
  auto total = ItemsOf(**tx).Get(g_payments, {{"message_id", Attr::S("totals")}, {"charge", Attr::S("all")}});
  ASSERT_OK(total);
  ASSERT_TRUE(total->has_value());
  EXPECT_EQ((**total).at("cents").AsInt(), 12000);
  auto none = ItemsOf(**tx).Get(g_payments, {{"message_id", Attr::S("nobody")}, {"charge", Attr::S("x")}});
  ASSERT_OK(none);
  EXPECT_FALSE(none->has_value());
}

// A condition of the handler's that fails at commit cancels everything:
// no item, no marker; the message fails and applies once the condition holds.
TEST_F(DynamoDbStore, AFailedConditionCancelsTheWholeTransaction) {
  Inbox& inbox = MakeInbox();
  const dynamodb::Item account = {{"message_id", Attr::S("account")}, {"charge", Attr::S("a-1")}};
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(Pay(tx, m.id, 4000));
    return ItemsOf(tx).Update(g_payments, account, "SET cents = cents - :c",
                              {.expression = "cents >= :c", .values = {{":c", Attr::N(4000)}}});
  };
  for (int round = 0; round < 2; ++round) {
    Outcome o = inbox.Handle(Msg("m-poor"), h);
    EXPECT_EQ(o.kind, Outcome::Kind::kFailed) << o.ToString();
    EXPECT_EQ(o.status.code(), Code::kConflict) << o.status;
    EXPECT_NE(o.status.message().find("condition of Update on table"), std::string::npos) << o.status;
  }
  EXPECT_EQ(CountPayments(*store_, "m-poor"), 0);
  EXPECT_FALSE(store_->FindMarker("payments", "m-poor")->has_value());
  {
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    dynamodb::Item funded = account;
    funded.insert_or_assign("cents", Attr::N(5000));
    ASSERT_OK(ItemsOf(**tx).Put(g_payments, funded));
    ASSERT_OK((*tx)->Commit());
  }
  EXPECT_EQ(inbox.Handle(Msg("m-poor"), h).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox.Handle(Msg("m-poor"), h).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(CountPayments(*store_, "m-poor"), 1);
}

// DynamoDB's 100 writes per transaction, the marker included: the 100th
// item (101st write) is refused at once, naming the limit; nothing commits.
TEST_F(DynamoDbStore, TheHundredWriteLimitIsNamed) {
  Inbox& inbox = MakeInbox();
  Status refused;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    for (int i = 0; i < 100; ++i) {
      Status s = Pay(tx, m.id, 1);
      if (!s.ok()) {
        refused = s;
        return s;
      }
    }
    return Status::OK();
  };
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(inbox.Handle(Msg("m-big"), h).kind, Outcome::Kind::kFailed);
    EXPECT_EQ(refused.code(), Code::kInvalidArgument);
    EXPECT_NE(refused.message().find("at most 100 writes"), std::string::npos) << refused;
  }
  EXPECT_EQ(CountPayments(*store_, "m-big"), 0);
  EXPECT_FALSE(store_->FindMarker("payments", "m-big")->has_value());
}

// A batch is one transaction: 100 messages fit (100 markers); the 101st
// marker is refused naming the limit, nothing of the batch commits, and
// the same messages in batches that fit apply.
TEST_F(DynamoDbStore, ABatchPastTheLimitIsRefusedWholeAndSmallerBatchesApply) {
  Inbox& inbox = MakeInbox();
  std::vector<Message> batch;
  for (int i = 0; i < 101; ++i) batch.push_back(Msg("b-" + std::to_string(i)));
  const Handler none = [](Transaction&, const Message&) { return Status::OK(); };
  for (int round = 0; round < 2; ++round) {
    for (const Outcome& o : inbox.HandleBatch(batch, none)) {
      EXPECT_EQ(o.kind, Outcome::Kind::kFailed);
      EXPECT_NE(o.status.message().find("at most 100 writes"), std::string::npos) << o.status;
    }
  }
  EXPECT_EQ(*store_->CountMarkers("payments"), 0);
  for (int round = 0; round < 2; ++round) {
    auto first = inbox.HandleBatch(std::span<const Message>(batch).first(100), none);
    auto last = inbox.HandleBatch(std::span<const Message>(batch).subspan(100), none);
    for (const Outcome& o : first) EXPECT_EQ(o.kind, round == 0 ? Outcome::Kind::kApplied : Outcome::Kind::kDuplicate);
    EXPECT_EQ(last[0].kind, round == 0 ? Outcome::Kind::kApplied : Outcome::Kind::kDuplicate);
  }
  EXPECT_EQ(*store_->CountMarkers("payments"), 101);
}

// Markers another process committed are found at commit, one or more per
// cancelled transaction (DynamoDB Local names one reason at a time): the
// batch runs again until every one is known, and only the new message
// applies.
TEST_F(DynamoDbStore, ABatchOfMarkersAnotherStoreCommittedIsSettled) {
  Inbox& inbox = MakeInbox();
  const Handler charge = [](Transaction& tx, const Message& m) { return Pay(tx, m.id, 4000); };
  std::vector<Message> batch;
  for (int i = 0; i < 6; ++i) batch.push_back(Msg("o-" + std::to_string(i)));
  for (const Outcome& o : inbox.HandleBatch(std::span<const Message>(batch).first(5), charge))
    ASSERT_EQ(o.kind, Outcome::Kind::kApplied) << o.ToString();
  auto other = dynamodb::Store::Open(Options(TableFor(dir_), &env_));  // another process's store
  ASSERT_OK(other);
  auto other_inbox = MustOpen<Inbox>(**other, Inbox::Options{.consumer = "payments", .env = &env_});
  for (int round = 0; round < 2; ++round) {
    std::vector<Outcome> out = other_inbox->HandleBatch(batch, charge);
    for (int i = 0; i < 6; ++i)
      EXPECT_EQ(out[i].kind, i < 5 || round == 1 ? Outcome::Kind::kDuplicate : Outcome::Kind::kApplied)
          << i << " " << out[i].ToString();
  }
  EXPECT_EQ(CountPayments(*store_, ""), 6);
}

// Markers carry the TTL attribute when asked; Open turned TTL on.
TEST_F(DynamoDbStore, MarkersCarryTheirExpiryWithATtl) {
  dynamodb::Store::Options o = Options(TableFor(dir_), &env_);
  o.marker_ttl_s = 86'400;
  auto store = dynamodb::Store::Open(o);
  ASSERT_OK(store);
  auto inbox = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments", .env = &env_});
  for (int i = 0; i < 2; ++i)
    inbox->Handle(Msg("m-ttl"), [](Transaction& tx, const Message& m) { return Pay(tx, m.id, 1); });
  json key = {{"pk", {{"S", "m|payments"}}}, {"sk", {{"B", dynamodb_internal::Base64("m-ttl")}}}};
  json r = Call("GetItem", {{"TableName", o.table}, {"Key", key}, {"ConsistentRead", true}});
  EXPECT_EQ(r["Item"]["expires_at"]["N"], std::to_string(env_.NowMs() / 1000 + 86'400));
  json ttl = Call("DescribeTimeToLive", {{"TableName", o.table}});
  EXPECT_EQ(ttl["TimeToLiveDescription"].value("AttributeName", ""), "expires_at") << ttl.dump();
  EXPECT_EQ(CountPayments(**store, "m-ttl"), 1);
}

// Bad input: a missing table with create_if_missing off, a URL with an
// unknown key, an endpoint where nothing listens.
TEST_F(DynamoDbStore, AMissingTableIsNamedWhenCreatingIsOff) {
  dynamodb::Store::Options o = Options("idem-no-such-table-" + TableFor(dir_).substr(5));
  o.create_if_missing = false;
  auto s = dynamodb::Store::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kNotFound) << s.status();
  EXPECT_NE(s.status().message().find(o.table), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("create_if_missing"), std::string::npos) << s.status();
}

TEST(DynamoDbUrl, ParsesItsKeysAndRefusesOthers) {
  auto o = dynamodb::Store::ParseUrl(
      "dynamodb://"
      "orders-idem?region=eu-west-1&endpoint=http%3A%2F%2F127.0.0.1%3A8000&profile=ops&create_if_missing=false"
      "&marker_ttl_s=604800&max_attempts=3&pool_size=4");
  ASSERT_OK(o);
  EXPECT_EQ(o->table, "orders-idem");
  EXPECT_EQ(o->region, "eu-west-1");
  EXPECT_EQ(o->endpoint, "http://127.0.0.1:8000");
  EXPECT_EQ(o->profile, "ops");
  EXPECT_FALSE(o->create_if_missing);
  EXPECT_EQ(o->marker_ttl_s, 604800);
  EXPECT_EQ(o->max_attempts, 3);
  EXPECT_EQ(o->pool_size, 4);
  auto bad = dynamodb::Store::ParseUrl("dynamodb://t-1?regoin=x");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("regoin"), std::string::npos) << bad.status();
  EXPECT_FALSE(dynamodb::Store::ParseUrl("dynamodb://t-1?max_attempts=0").ok());
  EXPECT_FALSE(dynamodb::Store::ParseUrl("postgres://t-1").ok());
}

// OpenStore and OpenClaimStore take the URL.
TEST_F(DynamoDbStore, OpenStoreTakesTheUrl) {
  ::setenv("AWS_ACCESS_KEY_ID", "idemtest", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "idemtest-secret", 1);
  const std::string url = "dynamodb://" + TableFor(dir_) + "?region=us-east-1&endpoint=" + Endpoint();
  auto store = OpenStore(url);
  ASSERT_OK(store);
  EXPECT_EQ((*store)->Kind(), "dynamodb");
  auto claims = OpenClaimStore(url);
  ASSERT_OK(claims);
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
}

// A tiny HTTP/1.1 server on 127.0.0.1 between the store and DynamoDB Local,
// for what the emulator never does: `plan` sees each request's operation
// (X-Amz-Target) and says whether to forward it, to forward it and then
// drop the connection without the answer (a lost answer), or to answer
// with the service's documented throttling error itself.
class Interposer {
 public:
  enum class Act { kForward, kLoseAnswer, kThrottle, kRefuseCredentials };
  explicit Interposer(std::function<Act(const std::string& operation)> plan) : plan_(std::move(plan)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    upstream_ = UrlPort(Endpoint());
    thread_ = std::thread([this] { Serve(); });
  }
  ~Interposer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
    // The connections' threads end once their sockets are shut down.
    std::vector<std::thread> conns;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (int c : conn_fds_) ::shutdown(c, SHUT_RDWR);
      conns.swap(conns_);
    }
    for (auto& t : conns) t.join();
    for (int c : conn_fds_) ::close(c);
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int count(const std::string& operation) {
    std::lock_guard<std::mutex> l(mu_);
    return seen_[operation];
  }

 private:
  // One HTTP message (headers and Content-Length body) from `fd`, or "".
  static std::string ReadMessage(int fd) {
    std::string in;
    char buf[65536];
    size_t need = std::string::npos;
    while (need == std::string::npos || in.size() < need) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return "";
      in.append(buf, static_cast<size_t>(n));
      const size_t end = in.find("\r\n\r\n");
      if (need == std::string::npos && end != std::string::npos) {
        std::string head = in.substr(0, end);
        std::transform(head.begin(), head.end(), head.begin(), [](unsigned char c) { return std::tolower(c); });
        const size_t cl = head.find("content-length:");
        need = end + 4 + (cl == std::string::npos ? 0 : std::strtoul(head.c_str() + cl + 15, nullptr, 10));
      }
    }
    return in;
  }
  static void SendAll(int fd, const std::string& out) {
    for (size_t sent = 0; sent < out.size();) {
      const ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }
  static void AnswerError(int fd, const std::string& type, const std::string& message) {
    const std::string body = R"({"__type":")" + type + R"(","message":")" + message + R"("})";
    SendAll(fd, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.0\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body);
  }
  std::string Forward(const std::string& request) {
    const int up = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(upstream_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string answer;
    if (::connect(up, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      SendAll(up, request);
      answer = ReadMessage(up);
    }
    ::close(up);
    return answer;
  }
  void Serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::lock_guard<std::mutex> l(mu_);
      conn_fds_.push_back(c);
      conns_.emplace_back([this, c] {
        for (;;) {
          const std::string request = ReadMessage(c);
          if (request.empty()) break;
          const size_t t = request.find("DynamoDB_20120810.");
          const std::string op = t == std::string::npos ? "" : request.substr(t + 18, request.find("\r\n", t) - t - 18);
          {
            std::lock_guard<std::mutex> l(mu_);
            ++seen_[op];
          }
          const Act act = plan_(op);
          // The service's documented error documents: a key it does not
          // know, a throttled call.
          if (act == Act::kRefuseCredentials) {
            AnswerError(c, "com.amazon.coral.service#UnrecognizedClientException",
                        "The security token included in the request is invalid.");
            continue;
          }
          if (act == Act::kThrottle) {
            AnswerError(c, "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                        "The level of configured provisioned throughput for the table was exceeded.");
            continue;
          }
          const std::string answer = Forward(request);
          if (act == Act::kLoseAnswer || answer.empty()) break;  // applied upstream, answer lost here
          SendAll(c, answer);
        }
        ::shutdown(c, SHUT_RDWR);  // the client sees the connection end (closed by the destructor)
      });
    }
  }
  std::function<Act(const std::string&)> plan_;
  int fd_ = -1, port_ = 0, upstream_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, int> seen_;
  std::vector<int> conn_fds_;       // closed by the destructor
  std::vector<std::thread> conns_;  // one per connection, joined by the destructor
};

// A commit whose answer is lost is sent again with the same
// ClientRequestToken: DynamoDB answers the second copy as the first,
// without applying it again, so the message is applied (not a duplicate
// of itself) and its effect is there once.
TEST_F(DynamoDbStore, ACommitWhoseAnswerIsLostIsSentAgainWithItsToken) {
  std::atomic<int> commits{0};
  Interposer lossy([&](const std::string& op) {
    return op == "TransactWriteItems" && commits++ == 0 ? Interposer::Act::kLoseAnswer : Interposer::Act::kForward;
  });
  dynamodb::Store::Options o = Options(TableFor(dir_), &env_);
  o.endpoint = lossy.endpoint();
  auto store = dynamodb::Store::Open(o);
  ASSERT_OK(store);
  auto inbox = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments", .env = &env_});
  auto charge = [](Transaction& tx, const Message& m) { return Pay(tx, m.id, 4000); };
  Outcome first = inbox->Handle(Msg("m-lost"), charge);
  EXPECT_EQ(first.kind, Outcome::Kind::kApplied) << first.ToString();
  EXPECT_EQ(lossy.count("TransactWriteItems"), 2) << "the commit was not sent again";
  EXPECT_EQ(inbox->Handle(Msg("m-lost"), charge).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(CountPayments(**store, "m-lost"), 1);
}

// Every answer of a commit lost: after its tries the commit is kInDoubt,
// and the Inbox reads the marker back (strongly consistent), finds it
// (the first try was applied), and counts the message applied, once.
TEST_F(DynamoDbStore, ACommitNeverAnsweredIsInDoubtAndTheMarkerSettlesIt) {
  Interposer silent([](const std::string& op) {
    return op == "TransactWriteItems" ? Interposer::Act::kLoseAnswer : Interposer::Act::kForward;
  });
  dynamodb::Store::Options o = Options(TableFor(dir_), &env_);
  o.endpoint = silent.endpoint();
  o.max_attempts = 3;
  auto store = dynamodb::Store::Open(o);
  ASSERT_OK(store);
  auto inbox = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments", .env = &env_});
  auto charge = [](Transaction& tx, const Message& m) { return Pay(tx, m.id, 4000); };
  Outcome first = inbox->Handle(Msg("m-silent"), charge);
  EXPECT_EQ(first.kind, Outcome::Kind::kApplied) << first.ToString();
  EXPECT_EQ(silent.count("TransactWriteItems"), 3) << "max_attempts tries, one token";
  EXPECT_EQ(MakeInbox().Handle(Msg("m-silent"), charge).kind, Outcome::Kind::kDuplicate)
      << "the redelivery, where answers come";
  EXPECT_EQ(CountPayments(**store, "m-silent"), 1);
}

// Throttling (ProvisionedThroughputExceeded) is retried a bounded number of
// times, then kBusy: the message is not acknowledged and nothing is written.
TEST_F(DynamoDbStore, ThrottledCommitsAreRetriedThenBusyAndNotAcknowledged) {
  Interposer throttling([](const std::string& op) {
    return op == "TransactWriteItems" ? Interposer::Act::kThrottle : Interposer::Act::kForward;
  });
  dynamodb::Store::Options o = Options(TableFor(dir_), &env_);
  o.endpoint = throttling.endpoint();
  o.max_attempts = 3;
  auto store = dynamodb::Store::Open(o);
  ASSERT_OK(store);
  auto inbox = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments", .env = &env_});
  auto charge = [](Transaction& tx, const Message& m) { return Pay(tx, m.id, 4000); };
  for (int round = 1; round <= 2; ++round) {
    Outcome o2 = inbox->Handle(Msg("m-throttled"), charge);
    EXPECT_EQ(o2.kind, Outcome::Kind::kFailed) << o2.ToString();
    EXPECT_EQ(o2.status.code(), Code::kBusy) << o2.status;
    EXPECT_FALSE(o2.ShouldAck());
    EXPECT_EQ(throttling.count("TransactWriteItems"), 3 * round) << "bounded: max_attempts per commit";
  }
  EXPECT_EQ(CountPayments(**store, "m-throttled"), 0);
  EXPECT_FALSE((*store)->FindMarker("payments", "m-throttled")->has_value());
}

// The test kit on DynamoDB: Harness with a dynamodb:// store_url (a table
// per run), a handler writing items, the state read back with a Scan. The
// correct handler passes every scenario; one that writes its payment
// outside the transaction is caught.
std::string PaymentsOfRun(const Context& ctx) {
  auto u = ParseUrl(ctx.store_url());
  return (u.ok() && !u->hosts.empty() ? u->hosts[0].host : std::string("none")) + "-payments";
}

Harness::Options KitOptions(const TempDir& dir) {
  Harness::Options o;
  o.store_url = "dynamodb://" + TableFor(dir) + "?region=us-east-1&endpoint=" + Endpoint();
  o.state = [](Context& ctx) -> Result<State> {
    json in = {{"TableName", PaymentsOfRun(ctx)}, {"ConsistentRead", true}};
    State state;
    for (;;) {
      json r = Call("Scan", in);
      for (const json& item : r["Items"])
        state.lines.push_back("message_id=" + item["message_id"]["S"].get<std::string>() +
                              " cents=" + item["cents"]["N"].get<std::string>());
      if (!r.contains("LastEvaluatedKey")) return state;
      in["ExclusiveStartKey"] = r["LastEvaluatedKey"];
    }
  };
  return o;
}

Subject KitSubject(bool outside) {
  return {.name = outside ? "charge-outside" : "charge", .handler = [outside](Context& ctx) -> Handler {
            g_payments = PaymentsOfRun(ctx);
            Store& store = ctx.store();
            EXPECT_OK(CreatePaymentsTable(store));
            return [outside, table = g_payments](Transaction& tx, const Message& m) -> Status {
              if (!outside) return Pay(tx, m.id, 4000);
              // The mistake: a write of its own, apart from the marker.
              json item = {
                  {"message_id", {{"S", m.id}}},
                  {"charge", {{"S", std::to_string(::getpid()) + m.id + std::to_string(std::random_device{}())}}},
                  {"cents", {{"N", "4000"}}}};
              Call("PutItem", {{"TableName", table}, {"Item", item}});
              return Status::OK();
            };
          }};
}

TEST(DynamoDbTestKit, TheHarnessRunsAnItemsHandlerAndCatchesAWriteOutsideTheTransaction) {
  ::setenv("AWS_ACCESS_KEY_ID", "idemtest", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "idemtest-secret", 1);
  std::vector<Message> messages;
  for (int i = 0; i < 4; ++i) messages.push_back(Msg("pay-" + std::to_string(i), "4000"));
  TempDir good_dir, bad_dir;
  Harness good(KitOptions(good_dir));
  auto report = good.Run(KitSubject(/*outside=*/false), messages);
  ASSERT_OK(report);
  EXPECT_TRUE(report->failures.empty()) << *report;
  EXPECT_EQ(report->store_kind, "dynamodb");
  Harness bad(KitOptions(bad_dir));
  auto caught = bad.Run(KitSubject(/*outside=*/true), messages);
  ASSERT_OK(caught);
  EXPECT_FALSE(caught->failures.empty()) << "a write apart from the marker was not caught";
}

// Refused credentials (the service's UnrecognizedClientException, from a
// local server: DynamoDB Local checks none) are named at Open, never retried.
TEST_F(DynamoDbStore, RefusedCredentialsAreNamedAtOpen) {
  Interposer refusing([](const std::string&) { return Interposer::Act::kRefuseCredentials; });
  dynamodb::Store::Options o = Options(TableFor(dir_), &env_);
  o.endpoint = refusing.endpoint();
  auto s = dynamodb::Store::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("credentials were refused"), std::string::npos) << s.status();
  EXPECT_EQ(refusing.count("DescribeTable"), 1) << "a refused key is not retried";
}

// A wrong region: the table is where it was made, not in the region named
// (DynamoDB Local keeps each region's tables apart, as the service does):
// kNotFound naming the table and the region.
TEST_F(DynamoDbStore, AWrongRegionDoesNotFindTheTable) {
  dynamodb::Store::Options o = Options(TableFor(dir_));
  o.region = "eu-west-3";
  o.create_if_missing = false;
  auto s = dynamodb::Store::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kNotFound) << s.status();
  EXPECT_NE(s.status().message().find("region eu-west-3"), std::string::npos) << s.status();
}

TEST(DynamoDbBadInput, AnEndpointWhereNothingListensIsUnavailable) {
  dynamodb::Store::Options o = Options("idem-nowhere");
  o.endpoint = "http://127.0.0.1:" + std::to_string(FirstFreePort(28390));
  o.max_attempts = 2;
  auto s = dynamodb::Store::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable) << s.status();
}

}  // namespace
}  // namespace idem::testing
