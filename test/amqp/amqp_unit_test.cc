// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::amqp without a broker: URL parsing, option checks, and the error an
// unreachable broker gives (naming host:port, never the password).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "amqp/conn.h"
#include "idem/amqp/publisher.h"
#include "idem/amqp/source.h"

namespace idem::amqp {
namespace {

using amqp_internal::ParseEndpoint;

TEST(AmqpEndpoint, ParsesUserPasswordHostPortVhost) {
  auto ep = ParseEndpoint("amqp://idem:s%40cret@127.0.0.1:56721/%2f");
  ASSERT_TRUE(ep.ok()) << ep.status();
  EXPECT_EQ(ep->user, "idem");
  EXPECT_EQ(ep->password, "s@cret");
  EXPECT_EQ(ep->host, "127.0.0.1");
  EXPECT_EQ(ep->port, 56721);
  EXPECT_EQ(ep->vhost, "/");
  EXPECT_EQ(ep->Where(), "127.0.0.1:56721");
}

TEST(AmqpEndpoint, DefaultsAndNamedVhost) {
  auto ep = ParseEndpoint("amqp://broker.example/payments");
  ASSERT_TRUE(ep.ok()) << ep.status();
  EXPECT_EQ(ep->user, "guest");
  EXPECT_EQ(ep->password, "guest");
  EXPECT_EQ(ep->port, 5672);
  EXPECT_EQ(ep->vhost, "payments");
  auto bare = ParseEndpoint("amqp://h");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->vhost, "/");
  auto v6 = ParseEndpoint("amqp://u:p@[::1]:5673");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->Where(), "[::1]:5673");
}

TEST(AmqpEndpoint, RejectsMalformedUrlsWithoutEchoingThePassword) {
  for (const char* url : {"http://h", "amqps://h", "amqp://", "amqp://u:topsecret@h:0/", "amqp://u:topsecret@h:99999",
                          "amqp://u:topsecret@h:x", "amqp://u:top%zzsecret@h", "amqp://u:topsecret@[::1"}) {
    auto ep = ParseEndpoint(url);
    ASSERT_FALSE(ep.ok()) << url;
    EXPECT_EQ(ep.status().code(), Code::kInvalidArgument) << url;
    EXPECT_EQ(ep.status().message().find("topsecret"), std::string::npos) << ep.status();
  }
}

TEST(AmqpSource, RejectsBadOptions) {
  EXPECT_EQ(Source::Open({.url = "amqp://h", .queue = ""}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Source::Open({.url = "amqp://h", .queue = "q", .prefetch = 0}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Source::Open({.url = "amqp://h", .queue = "q", .prefetch = 70000}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Source::Open({.url = "nope", .queue = "q"}).status().code(), Code::kInvalidArgument);
}

// declare_queue has one default, whether the options are written or read
// from a URL, for the publisher as for the source: true.
TEST(AmqpPublisher, DeclareQueueHasOneDefaultInOptionsAndFromAUrl) {
  EXPECT_TRUE(Publisher::Options{}.declare_queue);
  EXPECT_EQ(Publisher::Options{}.declare_queue, Source::Options{}.declare_queue);
  auto from_url = Publisher::ParseUrl("amqp://h/%2f?queue=q");
  ASSERT_TRUE(from_url.ok()) << from_url.status();
  EXPECT_EQ(from_url->declare_queue, Publisher::Options{}.declare_queue);
  auto source_url = Source::ParseUrl("amqp://h/%2f?queue=q");
  ASSERT_TRUE(source_url.ok()) << source_url.status();
  EXPECT_EQ(source_url->declare_queue, Publisher::Options{}.declare_queue);
}

// A port on 127.0.0.1 where nothing listens: bound, never listened on.
int ClosedPort(int* fd_out) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *fd_out = fd;
  return ntohs(a.sin_port);
}

TEST(AmqpSource, UnreachableBrokerIsUnavailableNamingHostAndPortNotThePassword) {
  int fd = -1;
  const int port = ClosedPort(&fd);
  ASSERT_GT(port, 0);
  const std::string url = "amqp://idem:topsecret@127.0.0.1:" + std::to_string(port) + "/%2f";
  auto src = Source::Open({.url = url, .queue = "q", .connect_timeout_ms = 2000});
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), Code::kUnavailable) << src.status();
  EXPECT_NE(src.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos) << src.status();
  EXPECT_EQ(src.status().message().find("topsecret"), std::string::npos) << src.status();
  auto pub = Publisher::Open({.url = url, .connect_timeout_ms = 2000});
  ASSERT_FALSE(pub.ok());
  EXPECT_EQ(pub.status().code(), Code::kUnavailable) << pub.status();
  EXPECT_EQ(pub.status().message().find("topsecret"), std::string::npos) << pub.status();
  ::close(fd);
}

}  // namespace
}  // namespace idem::amqp
