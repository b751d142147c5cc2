// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Who the client is behind a trusted proxy (src/httplib/client_address.h):
// addresses and CIDR blocks, PROXY protocol v1 and v2 headers, and
// X-Forwarded-For, with the malformed and hostile values each can carry.
#include "httplib/client_address.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace idem::httplib::internal {
namespace {

std::string Canon(std::string_view text) {
  const auto a = ParseIp(text);
  return a ? CanonicalIp(*a) : "(none)";
}

TEST(ClientAddressTest, AddressesParseToOneCanonicalText) {
  EXPECT_EQ(Canon("10.0.0.1"), "10.0.0.1");
  EXPECT_EQ(Canon("::ffff:10.0.0.1"), "10.0.0.1");  // v4-mapped is the v4 address
  EXPECT_EQ(Canon("0:0::1"), "::1");
  EXPECT_EQ(Canon("2001:DB8:0:0::1"), "2001:db8::1");
  for (const char* bad : {"", "010.0.0.1", "10.0.0", "10.0.0.1 ", "10.0.0.256", "fe80::1%eth0", "example.com",
                          "unknown", "1.2.3.4:80", "[::1]"})
    EXPECT_EQ(Canon(bad), "(none)") << bad;
  EXPECT_EQ(CanonicalIp(std::string_view("not-an-address")), "not-an-address");
}

TEST(ClientAddressTest, TrustedProxiesMatchAddressesAndBlocks) {
  std::string bad;
  const auto t = TrustedProxies::Parse({"10.1.2.3/8", "192.0.2.7", " fd00::/8 ", "172.16.0.0/12"}, bad);
  ASSERT_TRUE(t.has_value()) << bad;
  for (const char* in : {"10.0.0.1", "10.255.255.255", "::ffff:10.9.9.9", "192.0.2.7", "fd12::1", "172.31.0.1"})
    EXPECT_TRUE(t->Contains(std::string_view(in))) << in;
  for (const char* out : {"11.0.0.1", "192.0.2.8", "fe00::1", "172.32.0.1", "::1", "garbage", ""})
    EXPECT_FALSE(t->Contains(std::string_view(out))) << out;
  const auto all_v4 = TrustedProxies::Parse({"0.0.0.0/0"}, bad);
  ASSERT_TRUE(all_v4.has_value());
  EXPECT_TRUE(all_v4->Contains(std::string_view("203.0.113.9")));
  EXPECT_FALSE(all_v4->Contains(std::string_view("2001:db8::1")));
  for (const char* wrong : {"10.0.0.0/33", "10.0.0.0/", "10.0.0.0/x", "::/129", "proxy.internal", "10.0.0.0/8/8", ""}) {
    EXPECT_FALSE(TrustedProxies::Parse({"127.0.0.1", wrong}, bad).has_value()) << wrong;
    EXPECT_EQ(bad, wrong);
  }
}

ProxyParse Parse(std::string_view bytes, ProxyHeader& h, std::string& why) { return ParseProxyHeader(bytes, h, why); }

TEST(ClientAddressTest, ProxyV1NamesTheClient) {
  ProxyHeader h;
  std::string why;
  const std::string line = "PROXY TCP4 203.0.113.7 192.0.2.1 56324 443\r\n";
  ASSERT_EQ(Parse(line + "GET / HTTP/1.1\r\n", h, why), ProxyParse::kDone) << why;
  EXPECT_EQ(h.length, line.size());
  ASSERT_TRUE(h.source.has_value());
  EXPECT_EQ(CanonicalIp(*h.source), "203.0.113.7");
  EXPECT_EQ(h.source_port, 56324);
  ASSERT_EQ(Parse("PROXY TCP6 2001:db8::7 2001:db8::1 1 65535\r\n", h, why), ProxyParse::kDone) << why;
  EXPECT_EQ(CanonicalIp(*h.source), "2001:db8::7");
  ASSERT_EQ(Parse("PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n", h, why), ProxyParse::kDone);
  EXPECT_FALSE(h.source.has_value());
  for (size_t n = 1; n < line.size(); ++n) EXPECT_EQ(Parse(line.substr(0, n), h, why), ProxyParse::kNeedMore) << n;
}

TEST(ClientAddressTest, MalformedProxyV1IsNamed) {
  ProxyHeader h;
  std::string why;
  for (const std::string& bad : std::vector<std::string>{
           "PROXY TCP4 203.0.113.7 192.0.2.1 56324\r\n", "PROXY TCP4 2001:db8::7 192.0.2.1 1 2\r\n",
           "PROXY TCP6 203.0.113.7 2001:db8::1 1 2\r\n", "PROXY TCP4 203.0.113.7 192.0.2.1 65536 443\r\n",
           "PROXY TCP4 203.0.113.7 192.0.2.1 0443 443\r\n", "PROXY TCP4 999.0.113.7 192.0.2.1 1 2\r\n",
           "PROXY TCP4  203.0.113.7 192.0.2.1 1 2\r\n", "PROXY UDP4 203.0.113.7 192.0.2.1 1 2\r\n",
           "PROXY TCP4 203.0.113.7 192.0.2.1 1 2\n", "PROXY " + std::string(120, 'A'), "GET / HTTP/1.1\r\n",
           "\x16\x03\x01"}) {
    EXPECT_EQ(Parse(bad, h, why), ProxyParse::kMalformed) << bad;
    EXPECT_FALSE(why.empty());
  }
  EXPECT_EQ(Parse("GET / HTTP/1.1\r\n", h, why), ProxyParse::kMalformed);
  EXPECT_NE(why.find("no PROXY header"), std::string::npos) << why;
}

// A v2 header: the signature, version 2 and `command`, `family_protocol`,
// then `addresses` (and its length).
std::string V2(int command, int family_protocol, const std::string& addresses) {
  std::string h("\r\n\r\n\0\r\nQUIT\n", 12);
  h += static_cast<char>(0x20 | command);
  h += static_cast<char>(family_protocol);
  h += static_cast<char>(addresses.size() >> 8);
  h += static_cast<char>(addresses.size() & 0xff);
  return h + addresses;
}

TEST(ClientAddressTest, ProxyV2NamesTheClient) {
  ProxyHeader h;
  std::string why;
  // 198.51.100.9:4660 -> 192.0.2.1:443, and a TLV after the addresses.
  const std::string inet("\xc6\x33\x64\x09\xc0\x00\x02\x01\x12\x34\x01\xbb\x04\x00\x01\x00", 16);
  const std::string v2 = V2(1, 0x11, inet);
  ASSERT_EQ(Parse(v2 + "GET", h, why), ProxyParse::kDone) << why;
  EXPECT_EQ(h.length, v2.size());
  EXPECT_EQ(CanonicalIp(*h.source), "198.51.100.9");
  EXPECT_EQ(h.source_port, 0x1234);
  std::string inet6(36, '\0');
  inet6[0] = '\x20';
  inet6[1] = '\x01';
  inet6[15] = '\x07';
  ASSERT_EQ(Parse(V2(1, 0x21, inet6), h, why), ProxyParse::kDone) << why;
  EXPECT_EQ(CanonicalIp(*h.source), "2001::7");
  ASSERT_EQ(Parse(V2(0, 0x00, ""), h, why), ProxyParse::kDone);  // LOCAL: a health check
  EXPECT_FALSE(h.source.has_value());
  for (size_t n = 1; n < v2.size(); ++n) EXPECT_EQ(Parse(v2.substr(0, n), h, why), ProxyParse::kNeedMore) << n;

  std::string version1 = v2;
  version1[12] = '\x11';
  for (const std::string& bad :
       {version1, V2(2, 0x11, inet), V2(1, 0x41, inet), V2(1, 0x11, inet.substr(0, 8)), V2(1, 0x21, inet)}) {
    EXPECT_EQ(Parse(bad, h, why), ProxyParse::kMalformed) << why;
    EXPECT_FALSE(why.empty());
  }
}

TEST(ClientAddressTest, OnlyAProxyHeaderLooksLikeOne) {
  EXPECT_TRUE(LooksLikeProxyHeader("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\nGET"));
  EXPECT_TRUE(LooksLikeProxyHeader(std::string("\r\n\r\n\0\r\nQU", 9)));
  for (const char* http : {"GET / HTTP/1.1\r\n", "PROPFIND / HTTP/1.1\r\n", "PROXY", "\r\n\r\n", "POST"})
    EXPECT_FALSE(LooksLikeProxyHeader(http)) << http;
}

TEST(ClientAddressTest, ForwardedForFieldsAreJoinedInOrderAnyCase) {
  EXPECT_EQ(ForwardedForIn("GET / HTTP/1.1\r\nX-Forwarded-For: 1.1.1.1\r\nHost: x\r\nx-forwarded-for:2.2.2.2, "
                           "3.3.3.3\r\n\r\n"),
            " 1.1.1.1,2.2.2.2, 3.3.3.3");
  EXPECT_EQ(ForwardedForIn("GET / HTTP/1.1\r\nX-Forwarded-Forx: 1.1.1.1\r\nHost: x\r\n\r\n"), "");
  EXPECT_EQ(ForwardedForIn(""), "");
}

TEST(ClientAddressTest, TheClientIsTheRightmostAddressNotATrustedProxy) {
  std::string bad;
  const auto trusted = TrustedProxies::Parse({"10.0.0.0/8", "2001:db8:ffff::/48"}, bad);
  ASSERT_TRUE(trusted.has_value());
  auto client = [&](std::string_view list) {
    IpAddress a;
    bad.clear();
    switch (ClientInForwardedFor(list, *trusted, a, bad)) {
      case ForwardedFor::kAbsent: return std::string("(absent)");
      case ForwardedFor::kMalformed: return "(malformed " + bad + ")";
      case ForwardedFor::kClient: break;
    }
    return CanonicalIp(a);
  };
  // {X-Forwarded-For, the client it names}
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"203.0.113.7", "203.0.113.7"},
      {"203.0.113.7, 10.0.0.2, 10.0.0.3", "203.0.113.7"},
      // What a client wrote itself, left of what the proxies appended, is never reached.
      {"1.1.1.1, <script>, 10.9.9.9, 203.0.113.7, 10.0.0.2", "203.0.113.7"},
      {"  203.0.113.7:4711 ,\t[2001:db8::5]:443 ", "2001:db8::5"},
      {"[2001:db8::5]", "2001:db8::5"},
      {"::ffff:203.0.113.7", "203.0.113.7"},
      {"10.0.0.9, 2001:db8:ffff::1", "10.0.0.9"},  // all trusted: the leftmost
      {"", "(absent)"},
      {"  ", "(absent)"},
      {"unknown", "(malformed unknown)"},
      {"203.0.113.7, 10.0.0.2, garbage", "(malformed garbage)"},
      {"203.0.113.7,", "(malformed )"},
      {",10.0.0.2", "(malformed )"},
      {"[2001:db8::5", "(malformed [2001:db8::5)"},
      {"[1.2.3.4]", "(malformed [1.2.3.4])"},
      {"203.0.113.7:99999", "(malformed 203.0.113.7:99999)"},
  };
  for (const auto& [list, named] : cases) EXPECT_EQ(client(list), named) << list;
  EXPECT_EQ(client(std::string(1000, 'x')), "(malformed " + std::string(64, 'x') + ")");
  // A hostile list of many entries is walked only to its first untrusted one.
  std::string many;
  for (int i = 0; i < 10000; ++i) many += "garbage,";
  EXPECT_EQ(client(many + "203.0.113.7"), "203.0.113.7");
}

TEST(ClientAddressTest, LogTextIsQuotedEscapedAndShort) {
  EXPECT_EQ(QuotedForLog("a\"b\\c\r\n\x01"), "\"a\\x22b\\x5cc\\x0d\\x0a\\x01\"");
  EXPECT_EQ(QuotedForLog(std::string(100, 'y')), "\"" + std::string(64, 'y') + "...\"");
}

}  // namespace
}  // namespace idem::httplib::internal
