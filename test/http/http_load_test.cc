// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The benchmarks' HTTP load (tools/idem/http_load.cc): every request posted
// exactly once and answered, over servers that close keep-alive connections,
// answer otherwise than expected, or frame their answers in ways the load
// must read; and its HTTP/1.1 framing helpers.
#include "http_load.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace idem::cli {
namespace {

std::vector<HttpPost> Posts(int n) {
  std::vector<HttpPost> posts(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    posts[static_cast<size_t>(i)].body = R"({"n":)" + std::to_string(i) + "}";
    posts[static_cast<size_t>(i)].headers = {{"Idempotency-Key", "k" + std::to_string(i)}};
  }
  return posts;
}

// A cpp-httplib server on 127.0.0.1 that counts each key's requests and
// answers 201 (or `status_of(key)`).
class CountingServer {
 public:
  explicit CountingServer(std::function<int(const std::string&)> status_of = nullptr, size_t keep_alive_max = 1000)
      : status_of_(std::move(status_of)) {
    server_.set_keep_alive_max_count(keep_alive_max);
    server_.set_tcp_nodelay(true);
    server_.Post("/charges", [this](const ::httplib::Request& req, ::httplib::Response& res) {
      const std::string key = req.get_header_value("Idempotency-Key");
      {
        std::lock_guard l(mu_);
        ++seen_[key];
        bodies_ok_ = bodies_ok_ && req.body == R"({"n":)" + key.substr(1) + "}";
      }
      res.status = status_of_ ? status_of_(key) : 201;
      res.set_content(R"({"key":")" + key + R"("})", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::yield();
  }
  ~CountingServer() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  std::map<std::string, int> seen() {
    std::lock_guard l(mu_);
    return seen_;
  }
  bool bodies_ok() {
    std::lock_guard l(mu_);
    return bodies_ok_;
  }

 private:
  std::function<int(const std::string&)> status_of_;
  ::httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, int> seen_;
  bool bodies_ok_ = true;
};

void ExpectEachOnce(CountingServer& s, int n) {
  const auto seen = s.seen();
  ASSERT_EQ(seen.size(), static_cast<size_t>(n));
  for (const auto& [key, count] : seen) EXPECT_EQ(count, 1) << key;
  EXPECT_TRUE(s.bodies_ok());
}

TEST(HttpLoadTest, EveryPostIsSentOnceAndAnswered) {
  CountingServer s;
  const PostedAll r = PostAll(s.port(), "/charges", Posts(500), 8, 201, "test");
  EXPECT_EQ(r.unexpected, 0);
  EXPECT_GT(r.seconds, 0);
  ExpectEachOnce(s, 500);
}

TEST(HttpLoadTest, MoreConnectionsThanPosts) {
  CountingServer s;
  const PostedAll r = PostAll(s.port(), "/charges", Posts(3), 6, 201, "test");
  EXPECT_EQ(r.unexpected, 0);
  ExpectEachOnce(s, 3);
}

// cpp-httplib closes a keep-alive connection after its 2nd request here
// ("Connection: close" on the answer): the load reconnects and goes on,
// sending nothing twice.
TEST(HttpLoadTest, ConnectionsTheServerClosesAreReopened) {
  CountingServer s(nullptr, /*keep_alive_max=*/2);
  const PostedAll r = PostAll(s.port(), "/charges", Posts(300), 4, 201, "test");
  EXPECT_EQ(r.unexpected, 0);
  ExpectEachOnce(s, 300);
}

TEST(HttpLoadTest, AnswersOtherThanExpectedAreCounted) {
  CountingServer s([](const std::string& key) { return key == "k7" || key == "k9" ? 500 : 201; });
  testing::internal::CaptureStderr();
  const PostedAll r = PostAll(s.port(), "/charges", Posts(50), 4, 201, "test");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.unexpected, 2);
  EXPECT_NE(err.find("idem test: /charges answered 500"), std::string::npos) << err;
  ExpectEachOnce(s, 50);
}

// An answer the load cannot frame (a chunked body) counts as unexpected, and
// its connection's next posts still go out, on a new connection.
TEST(HttpLoadTest, AChunkedAnswerIsCountedAndTheNextPostsStillGo) {
  ::httplib::Server server;
  server.set_tcp_nodelay(true);
  std::mutex mu;
  std::map<std::string, int> seen;
  server.Post("/charges", [&](const ::httplib::Request& req, ::httplib::Response& res) {
    const std::string key = req.get_header_value("Idempotency-Key");
    {
      std::lock_guard l(mu);
      ++seen[key];
    }
    res.status = 201;
    if (key != "k3") return res.set_content("{}", "application/json");
    res.set_chunked_content_provider("application/json", [](size_t, ::httplib::DataSink& sink) {
      sink.write("{}", 2);
      sink.done();
      return true;
    });
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread t([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::yield();
  testing::internal::CaptureStderr();
  const PostedAll r = PostAll(port, "/charges", Posts(10), 1, 201, "test");
  const std::string err = testing::internal::GetCapturedStderr();
  server.stop();
  t.join();
  EXPECT_EQ(r.unexpected, 1);
  EXPECT_NE(err.find("a chunked body"), std::string::npos) << err;
  EXPECT_EQ(seen.size(), 10u);
  for (const auto& [key, count] : seen) EXPECT_EQ(count, 1) << key;
}

TEST(HttpLoadTest, NoServerMeansEveryPostUnanswered) {
  int port;
  {
    CountingServer gone;
    port = gone.port();
  }
  testing::internal::CaptureStderr();
  const PostedAll r = PostAll(port, "/charges", Posts(20), 4, 201, "test");
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.unexpected, 20);
}

TEST(HttpLoadTest, ParsesAHeadOnlyOnceComplete) {
  EXPECT_FALSE(ParseHttpHead("HTTP/1.1 201 Created\r\nContent-Length: 5\r\n"));
  const std::string msg =
      "HTTP/1.1 201 Created\r\ncontent-length:  12 \r\nCONNECTION: Close\r\nX-A: b\r\n\r\nhello world!";
  const auto h = ParseHttpHead(msg);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->start_line, "HTTP/1.1 201 Created");
  EXPECT_EQ(h->head_size, msg.size() - 12);
  EXPECT_EQ(h->content_length, 12);
  EXPECT_TRUE(h->close);
  EXPECT_FALSE(h->chunked);
  EXPECT_EQ(HttpHeaderValue(*h, "x-a"), "b");
  EXPECT_EQ(HttpHeaderValue(*h, "X-Missing"), "");
  const auto c = ParseHttpHead("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->chunked);
  EXPECT_EQ(c->content_length, 0);
  EXPECT_FALSE(c->close);
}

}  // namespace
}  // namespace idem::cli
