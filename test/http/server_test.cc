// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::httplib::Server's connection loop, over real loopback sockets written
// and read by hand (so the test sees the bytes as they are on the wire):
// pipelined requests, 100 Continue, long bodies both ways, stop() with idle
// keep-alive connections, the peer's address.
#include "idem/httplib/server.h"
#include "idem/httplib/metrics_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "http/http_test_util.h"

namespace idem::testing {
namespace {

// A raw TCP connection to 127.0.0.1:port; reads give up after 20 s (a lost
// response fails the test instead of hanging it).
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    timeval tv{20, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int yes = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool connected() const { return connected_; }

  bool Send(const std::string& bytes) {
    for (size_t sent = 0; sent < bytes.size();) {
      ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // The next response's head (status line and headers) and body (by its
  // Content-Length); nullopt when the connection ends or times out first.
  struct Reply {
    std::string head, body;
    int status = 0;
  };
  std::optional<Reply> Read() {
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos)
      if (!Fill()) return std::nullopt;
    Reply r;
    r.head = buf_.substr(0, end + 2);
    buf_.erase(0, end + 4);
    r.status = std::atoi(r.head.c_str() + 9);
    size_t length = 0;
    if (auto at = Lower(r.head).find("content-length:"); at != std::string::npos)
      length = std::strtoul(r.head.c_str() + at + 15, nullptr, 10);
    while (buf_.size() < length)
      if (!Fill()) return std::nullopt;
    r.body = buf_.substr(0, length);
    buf_.erase(0, length);
    return r;
  }
  // Reads until the peer closes (true) or the read times out (false).
  bool SeesClose() {
    while (Fill()) {
    }
    return closed_;
  }
  // Bytes read but not taken by Read().
  const std::string& rest() const { return buf_; }
  // Reads at least one more byte (false: the connection ended or timed out).
  bool ReadMore() { return Fill(); }
  void Close() {
    ::close(fd_);
    fd_ = -1;
  }

 private:
  static std::string Lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  bool Fill() {
    char chunk[16384];
    ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n == 0) closed_ = true;
    if (n <= 0) return false;
    buf_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false, closed_ = false;
  std::string buf_;
};

std::string Post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + extra + "\r\n" + body;
}

// POST /echo answers "echo:" and the body.
void AddEcho(::httplib::Server& server) {
  server.Post("/echo", [](const ::httplib::Request& req, ::httplib::Response& res) {
    res.set_content("echo:" + req.body, "text/plain");
  });
}

// Every case runs with a thread per connection (0) and with the connections
// as fibers on 2 threads (Server::set_fibers).
class ServerTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    server_.set_fibers(GetParam());
    AddEcho(server_.server());
    server_.server().Get("/peer", [](const ::httplib::Request& req, ::httplib::Response& res) {
      res.set_content(req.remote_addr + " " + std::to_string(req.remote_port) + " " + req.local_addr + " " +
                          std::to_string(req.local_port),
                      "text/plain");
    });
    server_.server().Get("/long", [](const ::httplib::Request& req, ::httplib::Response& res) {
      const size_t n = std::stoul(req.get_param_value("n"));
      res.set_content_provider(n, "text/plain", [](size_t offset, size_t length, ::httplib::DataSink& sink) {
        std::string piece(std::min<size_t>(length, 10'000), '\0');
        for (size_t i = 0; i < piece.size(); ++i) piece[i] = static_cast<char>('a' + (offset + i) % 26);
        sink.write(piece.data(), piece.size());
        return true;
      });
    });
  }

  // Starts the server on first use: a test adds its own routes before that
  // (cpp-httplib's route table is not for changing while it serves).
  int Port() {
    if (!started_) {
      server_.Start();
      started_ = true;
    }
    return server_.port();
  }

  LoopbackServer server_;
  bool started_ = false;
};

std::string ModeName(const ::testing::TestParamInfo<int>& p) {
  return p.param == 0 ? std::string("Threads") : "FibersOn" + std::to_string(p.param);
}
INSTANTIATE_TEST_SUITE_P(Connections, ServerTest, ::testing::Values(0, 2), ModeName);

TEST_P(ServerTest, PipelinedRequestsSentInOneWriteAreEachAnsweredInOrder) {
  RawConnection c(Port());
  ASSERT_TRUE(c.connected());
  // Three requests in one segment: the first read takes all of them.
  ASSERT_TRUE(c.Send(Post("/echo", "one") + Post("/echo", "two") + Post("/echo", "three")));
  for (const char* want : {"echo:one", "echo:two", "echo:three"}) {
    auto r = c.Read();
    ASSERT_TRUE(r.has_value()) << "no response for " << want << ": a pipelined request was lost";
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, want);
  }
}

TEST_P(ServerTest, KeepAliveConnectionEndsAfterItsMaximumCount) {
  LoopbackServer server({.keep_alive_requests = 3});
  server.set_fibers(GetParam());
  AddEcho(server.server());
  server.Start();
  RawConnection c(server.port());
  ASSERT_TRUE(c.connected());
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(c.Send(Post("/echo", std::to_string(i))));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value()) << i;
    EXPECT_EQ(r->body, "echo:" + std::to_string(i));
    EXPECT_EQ(r->head.find("Connection: close") != std::string::npos, i == 3) << r->head;
  }
  EXPECT_TRUE(c.SeesClose());
  EXPECT_EQ(idem::httplib::Server::Open({.keep_alive_requests = 0}).status().code(), Code::kInvalidArgument);
}

// By default a connection serves 1000 requests (not cpp-httplib's 5, which
// makes every client, and a proxy's pool, reconnect each fifth request).
TEST_P(ServerTest, KeepAliveConnectionServesAThousandRequestsByDefaultEachAnsweredWhole) {
  RawConnection c(Port());
  ASSERT_TRUE(c.connected());
  for (int i = 1; i <= 1000; ++i) {
    ASSERT_TRUE(c.Send(Post("/echo", std::to_string(i))));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value()) << i;
    ASSERT_EQ(r->body, "echo:" + std::to_string(i));
    ASSERT_EQ(r->head.find("Connection: close") != std::string::npos, i == 1000) << i << ": " << r->head;
  }
  EXPECT_TRUE(c.SeesClose());
  EXPECT_EQ(server_.counters().accepted, 1);
}

TEST_P(ServerTest, ExpectContinueGetsItsInterimReplyBeforeTheBodyIsSent) {
  RawConnection c(Port());
  ASSERT_TRUE(c.connected());
  const std::string body = "payload";
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + std::to_string(body.size()) +
                     "\r\nExpect: 100-continue\r\n\r\n"));
  // The body is not sent until the interim reply arrives: a server that held
  // it back in a buffer would wait for the body forever.
  auto interim = c.Read();
  ASSERT_TRUE(interim.has_value()) << "no 100 Continue";
  EXPECT_EQ(interim->status, 100);
  ASSERT_TRUE(c.Send(body));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "echo:payload");
}

TEST_P(ServerTest, LongBodiesBothWaysArriveByteExact) {
  RawConnection c(Port());
  ASSERT_TRUE(c.connected());
  std::string big(1'000'003, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('0' + i % 10);
  ASSERT_TRUE(c.Send(Post("/echo", big)));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "echo:" + big);
  // A streamed response longer than the server's write buffer goes out in pieces.
  ASSERT_TRUE(c.Send("GET /long?n=300001 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  auto l = c.Read();
  ASSERT_TRUE(l.has_value());
  ASSERT_EQ(l->body.size(), 300'001u);
  for (size_t i = 0; i < l->body.size(); i += 4999) ASSERT_EQ(l->body[i], static_cast<char>('a' + i % 26)) << i;
}

// Every request of a keep-alive connection (the addresses are looked up
// once per connection).
TEST_P(ServerTest, TheRequestKnowsThePeerAndLocalAddress) {
  RawConnection c(Port());
  ASSERT_TRUE(c.connected());
  std::string first;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(c.Send("GET /peer HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->body.rfind("127.0.0.1 ", 0), 0u) << r->body;
    EXPECT_NE(r->body.find(" 127.0.0.1 " + std::to_string(Port())), std::string::npos) << r->body;
    if (i == 0) first = r->body;
    EXPECT_EQ(r->body, first);  // the same peer port too
  }
}

TEST_P(ServerTest, ConnectionCloseIsHonouredAfterTheResponse) {
  RawConnection c(Port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx"));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "echo:x");
  EXPECT_TRUE(c.SeesClose());
}

TEST_P(ServerTest, AMalformedRequestGetsOne400AndTheConnectionCloses) {
  RawConnection c(Port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send("NOT A REQUEST\r\nHost: x\r\n\r\n"));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 400);
  // Closed at once (the 20 s read timeout would fail SeesClose), and the
  // unread header lines were not taken for requests of their own.
  EXPECT_TRUE(c.SeesClose());
  EXPECT_EQ(c.rest(), "") << "more responses after the 400";
}

// A request cpp-httplib rejects before reading its body: the body must not
// be read as the next request on the connection (request smuggling).
TEST_P(ServerTest, TheBodyOfARejectedRequestIsNeverServedAsARequest) {
  std::atomic<int> hidden{0};
  server_.server().Post("/hidden", [&](const ::httplib::Request&, ::httplib::Response& res) {
    ++hidden;
    res.set_content("ran", "text/plain");
  });
  RawConnection c(Port());
  ASSERT_TRUE(c.connected());
  const std::string inner = Post("/hidden", "x");
  ASSERT_TRUE(
      c.Send("BREW /pot HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(inner.size()) + "\r\n\r\n" + inner));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(c.SeesClose());
  EXPECT_EQ(c.rest(), "") << "more responses after the 400";
  EXPECT_EQ(hidden.load(), 0) << "the rejected request's body ran as a request";
}

// A handler's own 4xx after the whole request was read keeps the connection.
TEST_P(ServerTest, AHandlersErrorAfterTheWholeRequestKeepsTheConnection) {
  server_.server().Post("/reject", [](const ::httplib::Request&, ::httplib::Response& res) {
    res.status = 400;
    res.set_content("no", "text/plain");
  });
  RawConnection c(Port());
  ASSERT_TRUE(c.connected());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.Send(Post("/reject", "body")));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value()) << i << ": the connection was closed after a handler's 400";
    EXPECT_EQ(r->status, 400);
  }
}

// A streamed response goes out as the provider writes it: here the provider
// waits for the client to have read the first chunk before it writes more.
TEST_P(ServerTest, AStreamedResponseGoesOutAsItIsWritten) {
  std::mutex mu;
  std::condition_variable cv;
  bool client_has_first = false;
  server_.server().Get("/stream", [&](const ::httplib::Request&, ::httplib::Response& res) {
    res.set_chunked_content_provider("text/plain", [&](size_t offset, ::httplib::DataSink& sink) {
      if (offset == 0) {
        sink.write("first;", 6);
        std::unique_lock l(mu);
        // Bounded: without streaming the client never sees the chunk.
        cv.wait_for(l, std::chrono::seconds(30), [&] { return client_has_first; });
        return true;
      }
      sink.write("second", 6);
      sink.done();
      return true;
    });
  });
  RawConnection c(Port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send("GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  while (c.rest().find("first;") == std::string::npos)
    ASSERT_TRUE(c.ReadMore()) << "the first chunk did not arrive while the provider waited: " << c.rest();
  {
    std::lock_guard l(mu);
    client_has_first = true;
  }
  cv.notify_all();
  while (c.rest().find("second") == std::string::npos) ASSERT_TRUE(c.ReadMore()) << c.rest();
  EXPECT_NE(c.rest().find("Transfer-Encoding: chunked"), std::string::npos) << c.rest();
}

// A provider that writes while its client is there stops once it is gone.
TEST_P(ServerTest, AProviderSeesItsClientLeave) {
  std::atomic<bool> ended{false};
  server_.server().Get("/forever", [&](const ::httplib::Request&, ::httplib::Response& res) {
    res.set_chunked_content_provider(
        "text/plain",
        [](size_t, ::httplib::DataSink& sink) {
          while (sink.is_writable()) {
            sink.write("tick\n", 5);
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
          return false;
        },
        [&](bool) { ended = true; });
  });
  {
    RawConnection c(Port());
    ASSERT_TRUE(c.connected());
    ASSERT_TRUE(c.Send("GET /forever HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
    while (c.rest().find("tick") == std::string::npos) ASSERT_TRUE(c.ReadMore());
    c.Close();
  }
  // Bounded wait for an event (not a speed check): a provider that never
  // saw the client leave would write forever.
  for (int i = 0; i < 3000 && !ended.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(ended.load()) << "the provider kept writing to a client that had left";
}

// cpp-httplib's own loop waits out the keep-alive timeout of an idle
// connection before it looks at stop() again: with an hour's timeout this
// test would hang until ctest's TIMEOUT fails it.
TEST_P(ServerTest, StopReturnsWhileKeepAliveConnectionsIdle) {
  LoopbackServer server;
  server.set_fibers(GetParam());
  server.server().set_keep_alive_timeout(3600);
  AddEcho(server.server());
  server.Start();
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(std::make_unique<RawConnection>(server.port()));
    ASSERT_TRUE(idle.back()->connected());
    ASSERT_TRUE(idle.back()->Send(Post("/echo", "x")));
    ASSERT_TRUE(idle.back()->Read().has_value());
  }
  server.Stop();  // returns: every idle connection saw stop()
  for (auto& c : idle) EXPECT_TRUE(c->SeesClose());
}

// One fiber thread, many connections: a connection waiting for the rest of
// its request gives the thread up, so the others are served meanwhile. (A
// fiber that blocked its thread in recv would hold every other connection
// until the read timeout, and the requests below would time out.)
TEST(ServerFibers, AConnectionWaitingForItsBodyDoesNotHoldUpTheOthers) {
  LoopbackServer server;
  server.set_fibers(1);
  server.server().set_read_timeout(60);
  AddEcho(server.server());
  server.Start();
  std::vector<std::unique_ptr<RawConnection>> waiting;
  for (int i = 0; i < 8; ++i) {
    waiting.push_back(std::make_unique<RawConnection>(server.port()));
    ASSERT_TRUE(waiting.back()->connected());
    // The head says 10 bytes of body; 4 come now, the rest at the end.
    ASSERT_TRUE(waiting.back()->Send("POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\nwait"));
  }
  for (int i = 0; i < 20; ++i) {
    RawConnection c(server.port());
    ASSERT_TRUE(c.connected());
    ASSERT_TRUE(c.Send(Post("/echo", "go" + std::to_string(i))));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value()) << i << ": not answered while other connections waited for their bodies";
    EXPECT_EQ(r->body, "echo:go" + std::to_string(i));
  }
  for (size_t i = 0; i < waiting.size(); ++i) {
    ASSERT_TRUE(waiting[i]->Send("ing" + std::to_string(i) + "xx"));
    auto r = waiting[i]->Read();
    ASSERT_TRUE(r.has_value()) << i;
    EXPECT_EQ(r->body, "echo:waiting" + std::to_string(i) + "xx");
  }
}

// A response larger than the socket's send buffer, to a client that reads it
// slowly: the fiber waits for room (the socket writable) and the whole body
// arrives, while another connection on the same thread is served.
TEST(ServerFibers, ALargeResponseToASlowReaderArrivesWholeWhileOthersAreServed) {
  LoopbackServer server;
  server.set_fibers(1);
  AddEcho(server.server());
  server.Start();
  RawConnection slow(server.port());
  ASSERT_TRUE(slow.connected());
  std::string big(4'000'000, 'b');
  ASSERT_TRUE(slow.Send(Post("/echo", big)));
  // Not read yet: the server's send fills the socket buffers and waits.
  RawConnection quick(server.port());
  ASSERT_TRUE(quick.connected());
  ASSERT_TRUE(quick.Send(Post("/echo", "q")));
  auto q = quick.Read();
  ASSERT_TRUE(q.has_value()) << "a connection was held up by another's full send buffer";
  EXPECT_EQ(q->body, "echo:q");
  auto r = slow.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body.size(), big.size() + 5);
  EXPECT_EQ(r->body, "echo:" + big);
}

// StopOnSignals(server): a SIGTERM raised in the process stops serving as
// Stop() does: a request in flight is answered, the idle keep-alive
// connection is closed, listen() returns; a second signal is harmless.
TEST_P(ServerTest, SigtermStopsAServerAttachedWithStopOnSignals) {
  auto opened = idem::httplib::Server::Open({.fibers = GetParam()});
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<idem::httplib::Server> server = std::move(*opened);
  server->native().Post("/slow", [&](const ::httplib::Request&, ::httplib::Response& res) {
    ::raise(SIGTERM);  // while this request is being handled
    ::raise(SIGTERM);
    res.set_content("answered", "text/plain");
  });
  AddEcho(server->native());
  const int port = server->native().bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  auto listening = std::async(std::launch::async, [&] { return server->native().listen_after_bind(); });
  RawConnection idle(port);
  ASSERT_TRUE(idle.connected());
  ASSERT_TRUE(idle.Send(Post("/echo", "x")));
  ASSERT_TRUE(idle.Read().has_value());
  StopOnSignals(server.get());
  RawConnection c(port);
  ASSERT_TRUE(c.Send(Post("/slow", "")));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value()) << "the request in flight is answered";
  EXPECT_EQ(r->body, "answered");
  // Bounded: a server that ignored the signal fails here instead of hanging.
  ASSERT_EQ(listening.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "listen() did not return";
  EXPECT_TRUE(idle.SeesClose());
  EXPECT_TRUE(c.SeesClose());
  server.reset();  // detaches
  StopOnSignals(nullptr);
}

// The small endpoint a service without a server of its own serves its
// Metrics on: GET /metrics answers Render(); bad options are refused.
TEST(MetricsEndpointTest, ServesTheMetricsTextAndRefusesBadOptions) {
  Metrics metrics;
  Event e;
  e.kind = EventKind::kDuplicate;
  e.consumer = "payments";
  for (int copy = 0; copy < 2; ++copy) metrics.OnEvent(e);
  auto endpoint = idem::httplib::MetricsEndpoint::Open(metrics, {.port = 0});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ::httplib::Client client("127.0.0.1", (*endpoint)->port());
  auto r = client.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->body.find("idem_duplicates_total{consumer=\"payments\"} 2\n"), std::string::npos) << r->body;
  EXPECT_EQ(client.Get("/other")->status, 404);
  EXPECT_EQ(idem::httplib::MetricsEndpoint::Open(metrics, {.port = 70000}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(idem::httplib::MetricsEndpoint::Open(metrics, {.port = 0, .path = "metrics"}).status().code(),
            Code::kInvalidArgument);
  // The port is taken: unavailable, naming it.
  auto again = idem::httplib::MetricsEndpoint::Open(metrics, {.port = (*endpoint)->port()});
  EXPECT_EQ(again.status().code(), Code::kUnavailable);
  EXPECT_NE(again.status().message().find(std::to_string((*endpoint)->port())), std::string::npos);
}

}  // namespace
}  // namespace idem::testing
