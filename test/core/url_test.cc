// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem/url.h: the one URL grammar (ParseUrl), percent-decoding and password
// redaction that every adapter and the idem command use.
#include "idem/url.h"

#include <gtest/gtest.h>

#include <string>

namespace idem::testing {
namespace {

TEST(RedactUrl, HidesTheUserinfoPassword) {
  // Redis's forms.
  EXPECT_EQ(RedactUrl("redis://:pw@h:1/2"), "redis://:***@h:1/2");
  EXPECT_EQ(RedactUrl("redis://user:pw@h"), "redis://user:***@h");
  EXPECT_EQ(RedactUrl("redis://pw@h"), "redis://***@h");  // a lone userinfo is Redis's password
  EXPECT_EQ(RedactUrl("redis://:p@w@h"), "redis://:***@h");
  EXPECT_EQ(RedactUrl("redis://h:1"), "redis://h:1");
  EXPECT_EQ(RedactUrl("redis://idem_pw:secret@h:1/2"), "redis://idem_pw:***@h:1/2");
  EXPECT_EQ(RedactUrl("rediss://:pw@h"), "rediss://:***@h");
  // PostgreSQL's.
  EXPECT_EQ(RedactUrl("postgres://u:pw@h:5432/db"), "postgres://u:***@h:5432/db");
  EXPECT_EQ(RedactUrl("postgres://u@h/db"), "postgres://u@h/db");  // a lone user is not a password there
  EXPECT_EQ(RedactUrl("postgresql://h/db"), "postgresql://h/db");
  // The sources'.
  EXPECT_EQ(RedactUrl("amqp://idem:secret@127.0.0.1:5672/%2f?queue=q"), "amqp://idem:***@127.0.0.1:5672/%2f?queue=q");
  EXPECT_EQ(RedactUrl("kafka://k1:9092,k2:9092?topic=t"), "kafka://k1:9092,k2:9092?topic=t");
  EXPECT_EQ(RedactUrl("embedded:/tmp/q.db?queue=x"), "embedded:/tmp/q.db?queue=x");
  // An '@' after the authority (in the path or query) is not userinfo.
  EXPECT_EQ(RedactUrl("redis://h/0?stream=a@b"), "redis://h/0?stream=a@b");
}

TEST(RedactUrl, HidesPasswordKeys) {
  EXPECT_EQ(RedactUrl("postgres://u@h/db?password=pw&sslmode=off"), "postgres://u@h/db?password=***&sslmode=off");
  EXPECT_EQ(RedactUrl("postgres://u:a@h/db?sslmode=off&password=b"), "postgres://u:***@h/db?sslmode=off&password=***");
  EXPECT_EQ(RedactUrl("host=h password=pw dbname=d"), "host=h password=*** dbname=d");
  EXPECT_EQ(RedactUrl("host=h password = 'p w' dbname=d"), "host=h password = *** dbname=d");
  // Only the key itself: a value that merely holds the word is kept.
  EXPECT_EQ(RedactUrl("postgres://u@h/db?application_name=mypassword"),
            "postgres://u@h/db?application_name=mypassword");
  EXPECT_EQ(RedactUrl("postgres://u@h/db?my_password=x"), "postgres://u@h/db?my_password=x");
}

TEST(RedactUrl, IsIdempotent) {
  for (const char* url : {"redis://:pw@h:1/2", "redis://pw@h", "postgres://u:a@h/db?password=b",
                          "host=h password = 'p w' dbname=d", "amqp://u:p@h/%2f"}) {
    const std::string once = RedactUrl(url);
    EXPECT_EQ(RedactUrl(once), once) << url;
    EXPECT_EQ(once.find("pw"), std::string::npos) << once;
  }
}

// Found by fuzz/url_fuzz.cc: a quoted password with text glued after it,
// and a '#' inside a quoted password (the authority ended there until it
// was hidden), each redacted differently the second time.
TEST(RedactUrl, IsIdempotentWhenHidingMovesTheAuthoritysEnd) {
  for (const char* url : {"host=h password='x y'glued dbname=d", "k://u password='#pw' dbname=d:x@h/",
                          "host=h password='a\\' pw' dbname=d"}) {
    const std::string once = RedactUrl(url);
    EXPECT_EQ(RedactUrl(once), once) << url;
    EXPECT_EQ(once.find("pw"), std::string::npos) << once;
  }
  EXPECT_EQ(RedactUrl("host=h password='x y'glued dbname=d"), "host=h password=*** dbname=d");
}

TEST(PercentDecode, DecodesAndRefusesBadEscapesWithoutEchoingThem) {
  EXPECT_EQ(*PercentDecode("p%40ss%3Aword"), "p@ss:word");
  EXPECT_EQ(*PercentDecode("%2f%2F"), "//");
  EXPECT_EQ(*PercentDecode("plain"), "plain");
  EXPECT_EQ(*PercentDecode(""), "");
  EXPECT_EQ(*PercentDecode("%00"), std::string(1, '\0'));
  for (const char* bad : {"topsecret%", "topsecret%4", "topsecret%zz", "%g0topsecret"}) {
    auto r = PercentDecode(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(r.status().message().find("topsecret"), std::string::npos) << r.status();
  }
}

TEST(ParseUrl, SplitsANetworkUrl) {
  auto u = ParseUrl("Redis://app:p%40ss@cache.local:6380,[::1]:7000,h3/5?stream=s&flag&b=x%26y");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scheme, "redis");
  EXPECT_TRUE(u->has_authority);
  EXPECT_TRUE(u->has_user);
  EXPECT_TRUE(u->has_password);
  EXPECT_EQ(u->user, "app");
  EXPECT_EQ(u->password, "p@ss");
  ASSERT_EQ(u->hosts.size(), 3u);
  EXPECT_EQ(u->hosts[0].host, "cache.local");
  EXPECT_EQ(u->hosts[0].port, 6380);
  EXPECT_EQ(u->hosts[1].host, "::1");
  EXPECT_EQ(u->hosts[1].port, 7000);
  EXPECT_EQ(u->hosts[2].port, 0);
  EXPECT_EQ(u->path, "/5");
  EXPECT_EQ(u->Get("stream"), "s");
  EXPECT_TRUE(u->Has("flag"));
  EXPECT_EQ(u->Get("flag", "fallback"), "");
  EXPECT_EQ(u->Get("b"), "x&y");
  EXPECT_EQ(u->Get("missing", "fallback"), "fallback");
}

TEST(ParseUrl, FileForm) {
  auto u = ParseUrl("embedded:/tmp/q%20x.db?queue=a", "embedded queue URL", UrlForm::kFile);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->path, "/tmp/q x.db");
  EXPECT_TRUE(u->hosts.empty());
  auto slashes = ParseUrl("embedded:///tmp/q.db", "URL", UrlForm::kFile);
  ASSERT_TRUE(slashes.ok());
  EXPECT_EQ(slashes->path, "/tmp/q.db");
  EXPECT_EQ(UrlScheme("Kafka-Mock:?topic=t"), "kafka-mock");
  EXPECT_EQ(UrlScheme("/no/scheme"), "");
  EXPECT_EQ(UrlScheme("1http://h"), "");
}

TEST(ParseUrl, RefusesBadUrlsWithThePasswordHidden) {
  for (const char* url : {"", "no-scheme", "redis:h", "redis://", "redis://u:topsecret@", "redis://u:topsecret@h:0",
                          "redis://u:topsecret@h:70000", "redis://u:topsecret@h:x", "redis://u:topsecret@[::1",
                          "redis://u:topsecret@[::1]x", "redis://u:top%zzsecret@h", "redis://u:topsecret@h?k=%4",
                          "redis://u:topsecret@h,"}) {
    auto u = ParseUrl(url, "Redis URL");
    ASSERT_FALSE(u.ok()) << url;
    EXPECT_EQ(u.status().code(), Code::kInvalidArgument) << url;
    EXPECT_EQ(u.status().message().find("topsecret"), std::string::npos) << u.status();
  }
}

TEST(ParseUrl, KeysAndValues) {
  auto u = ParseUrl("kafka://u:topsecret@h:1?topic=t&lease_ms=250&on=yes&off=0&bad=1x&neg=-1");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_TRUE(u->CheckKeys({"topic", "lease_ms", "on", "off", "bad", "neg"}).ok());
  Status unknown = u->CheckKeys({"topic"});
  EXPECT_EQ(unknown.code(), Code::kInvalidArgument);
  EXPECT_NE(unknown.message().find("unknown parameter 'lease_ms'"), std::string::npos) << unknown;
  EXPECT_EQ(unknown.message().find("topsecret"), std::string::npos) << unknown;
  EXPECT_EQ(*u->GetInt("lease_ms", 7, 1, 1000), 250);
  EXPECT_EQ(*u->GetInt("absent", 7, 1, 1000), 7);
  EXPECT_EQ(u->GetInt("lease_ms", 7, 1, 100).status().code(), Code::kInvalidArgument);  // out of range
  for (const char* k : {"bad", "neg", "topic"}) {
    auto r = u->GetInt(k, 0, -10, 10);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << k;
    EXPECT_NE(r.status().message().find(k), std::string::npos) << r.status();
    EXPECT_EQ(r.status().message().find("topsecret"), std::string::npos) << r.status();
  }
  EXPECT_TRUE(*u->GetBool("on", false));
  EXPECT_FALSE(*u->GetBool("off", true));
  EXPECT_TRUE(*u->GetBool("absent", true));
  EXPECT_EQ(u->GetBool("topic", true).status().code(), Code::kInvalidArgument);
  auto twice = ParseUrl("kafka://h?topic=a&topic=b");
  ASSERT_TRUE(twice.ok());
  Status dup = twice->CheckKeys({"topic"});
  EXPECT_NE(dup.message().find("given twice"), std::string::npos) << dup;
}

TEST(FormatUrl, PrintsBackAUrlThatParsesToTheSameFields) {
  auto same = [](std::string_view url, UrlForm form) {
    auto u = ParseUrl(url, "URL", form);
    ASSERT_TRUE(u.ok()) << u.status();
    const std::string printed = FormatUrl(*u);
    auto again = ParseUrl(printed, "URL", form);
    ASSERT_TRUE(again.ok()) << printed << ": " << again.status();
    EXPECT_EQ(again->scheme, u->scheme) << printed;
    EXPECT_EQ(again->has_authority, u->has_authority) << printed;
    EXPECT_EQ(again->has_user, u->has_user) << printed;
    EXPECT_EQ(again->has_password, u->has_password) << printed;
    EXPECT_EQ(again->user, u->user) << printed;
    EXPECT_EQ(again->password, u->password) << printed;
    EXPECT_EQ(again->path, u->path) << printed;
    EXPECT_EQ(again->query, u->query) << printed;
    ASSERT_EQ(again->hosts.size(), u->hosts.size()) << printed;
    for (size_t i = 0; i < u->hosts.size(); ++i) {
      EXPECT_EQ(again->hosts[i].host, u->hosts[i].host) << printed;
      EXPECT_EQ(again->hosts[i].port, u->hosts[i].port) << printed;
    }
  };
  same("redis://u%3Ax:p%40ss@h1:1,[::1]:2,[h3]/a%3Fb/c?k=v%26w&e&=x", UrlForm::kNetwork);
  same("redis://@h", UrlForm::kNetwork);
  same("amqp://:@h/%2F", UrlForm::kNetwork);
  same("sqlite:/tmp/a%20b%3F.db?synchronous=normal", UrlForm::kFile);
  same("sqlite:%2F%2Fnot-an-authority", UrlForm::kFile);  // printed as sqlite:%2F/...
  same("sqlite:////abs", UrlForm::kFile);
  same("embedded:q.db", UrlForm::kFile);

  auto u = ParseUrl("REDIS://us%65r:pw@h:6379/0?prefix=a%2Fb");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(FormatUrl(*u), "redis://user:pw@h:6379/0?prefix=a%2Fb");
  auto ipv6 = ParseUrl("redis://[::1]:6380");
  ASSERT_TRUE(ipv6.ok()) << ipv6.status();
  EXPECT_EQ(FormatUrl(*ipv6), "redis://[::1]:6380");
}

}  // namespace
}  // namespace idem::testing
