// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// What the Redis adapter decides without a server: URL parsing, redaction,
// the hiredis error translation table, key naming helpers.
#include <gtest/gtest.h>

#include <cstring>

#include "idem/redis/claim_store.h"
#include "idem/url.h"
#include "redis/client.h"

namespace idem::testing {
namespace {

using redis_internal::ParseUrl;

TEST(RedisUrl, ParsesEveryPart) {
  auto plain = ParseUrl("redis://127.0.0.1");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->host, "127.0.0.1");
  EXPECT_EQ(plain->port, 6379);
  EXPECT_EQ(plain->db, 0);
  EXPECT_EQ(plain->password, "");

  auto full = ParseUrl("redis://app:p%40ss%3Aword@cache.local:6380/5");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->user, "app");
  EXPECT_EQ(full->password, "p@ss:word");
  EXPECT_EQ(full->host, "cache.local");
  EXPECT_EQ(full->port, 6380);
  EXPECT_EQ(full->db, 5);
  EXPECT_EQ(full->Address(), "cache.local:6380");

  auto pw_only = ParseUrl("redis://:s3cret@h:1/");
  ASSERT_TRUE(pw_only.ok()) << pw_only.status();
  EXPECT_EQ(pw_only->user, "");
  EXPECT_EQ(pw_only->password, "s3cret");
  EXPECT_EQ(pw_only->db, 0);

  auto v6 = ParseUrl("redis://[::1]:7000");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 7000);
  EXPECT_EQ(v6->Address(), "[::1]:7000");
}

TEST(RedisUrl, RefusesWhatItCannotUseWithoutShowingThePassword) {
  for (const char* url :
       {"", "127.0.0.1:6379", "http://h", "rediss://:s3cret@h", "redis://", "redis://:1", "redis://h:", "redis://h:0",
        "redis://h:70000", "redis://h:x", "redis://h/x", "redis://h/-1", "redis://h?db=1", "redis://[::1",
        "redis://[::1]x", "redis://s3cret@h", "redis://:s3cret%4@h", "redis://:s3cret%zz@h", "redis://u:@h"}) {
    auto ep = ParseUrl(url);
    ASSERT_FALSE(ep.ok()) << "'" << url << "'";
    EXPECT_EQ(ep.status().code(), Code::kInvalidArgument) << url;
    EXPECT_EQ(ep.status().message().find("s3cret"), std::string::npos) << ep.status();
  }
}

TEST(RedisUrl, Redaction) {
  EXPECT_EQ(idem::RedactUrl("redis://:pw@h:1/2"), "redis://:***@h:1/2");
  EXPECT_EQ(idem::RedactUrl("redis://user:pw@h"), "redis://user:***@h");
  EXPECT_EQ(idem::RedactUrl("redis://pw@h"), "redis://***@h");
  EXPECT_EQ(idem::RedactUrl("redis://:p@w@h"), "redis://:***@h");
  EXPECT_EQ(idem::RedactUrl("redis://h:1"), "redis://h:1");
  EXPECT_EQ(idem::UrlScheme("redis://h"), "redis");
  EXPECT_NE(idem::UrlScheme("postgres://h"), "redis");
}

TEST(RedisErrors, TranslationTable) {
  using redis_internal::CodeFor;
  struct Row {
    int context_err;
    const char* reply;
    Code code;
  } rows[] = {
      {REDIS_ERR_IO, "", Code::kUnavailable},
      {REDIS_ERR_EOF, "", Code::kUnavailable},
      {REDIS_ERR_OTHER, "", Code::kUnavailable},
      {REDIS_ERR_OOM, "", Code::kRetryable},
      {REDIS_ERR_PROTOCOL, "", Code::kInternal},
      {0, "NOAUTH Authentication required.", Code::kUnavailable},
      {0, "WRONGPASS invalid username-password pair or user is disabled.", Code::kUnavailable},
      {0, "NOPERM this user has no permissions to run the 'evalsha' command", Code::kUnavailable},
      {0, "LOADING Redis is loading the dataset in memory", Code::kUnavailable},
      {0, "READONLY You can't write against a read only replica.", Code::kUnavailable},
      {0, "MASTERDOWN Link with MASTER is down", Code::kUnavailable},
      {0, "OOM command not allowed when used memory > 'maxmemory'.", Code::kUnavailable},
      {0, "BUSY Redis is busy running a script.", Code::kBusy},
      {0, "TRYAGAIN Multiple keys request during rehashing of slot", Code::kRetryable},
      {0, "MOVED 3999 127.0.0.1:6381", Code::kInvalidArgument},
      {0, "CROSSSLOT Keys in request don't hash to the same slot", Code::kInvalidArgument},
      {0, "NOSCRIPT No matching script. Please use EVAL.", Code::kNotFound},
      {0, "WRONGTYPE Operation against a key holding the wrong kind of value", Code::kCorruption},
      {0, "ERR user_script:3: Script attempted to access nonexistent global variable", Code::kInternal},
  };
  for (const Row& r : rows) EXPECT_EQ(CodeFor(r.context_err, r.reply), r.code) << r.context_err << " " << r.reply;
}

TEST(RedisErrors, StatusesSayWhatFailed) {
  redisContext ctx{};
  ctx.err = REDIS_ERR_EOF;
  std::strcpy(ctx.errstr, "Server closed the connection");
  Status lost = redis_internal::Translate(&ctx, nullptr, "Redis at h:1: script try_claim");
  EXPECT_EQ(lost.code(), Code::kUnavailable);
  EXPECT_NE(lost.message().find("h:1"), std::string::npos) << lost;
  EXPECT_NE(lost.message().find("may or may not have run"), std::string::npos) << lost;

  std::string text = "MOVED 3999 127.0.0.1:6381";
  redisReply reply{};
  reply.type = REDIS_REPLY_ERROR;
  reply.str = text.data();
  reply.len = text.size();
  Status moved = redis_internal::Translate(&ctx, &reply, "EVALSHA");
  EXPECT_EQ(moved.code(), Code::kInvalidArgument);
  EXPECT_NE(moved.message().find("Cluster is not supported"), std::string::npos) << moved;

  redisReply fine{};
  fine.type = REDIS_REPLY_STATUS;
  EXPECT_TRUE(redis_internal::Translate(&ctx, &fine, "PING").ok());
}

TEST(RedisKeys, NamesCannotCollideAndGlobsAreEscaped) {
  EXPECT_EQ(redis_internal::LengthPrefixed("a:b"), "3:a:b");
  EXPECT_NE(redis_internal::LengthPrefixed("a:b") + ":c", redis_internal::LengthPrefixed("a") + ":b:c");
  EXPECT_EQ(redis_internal::GlobEscape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
  EXPECT_TRUE(redis_internal::ValidateClientName("idem-app_1").ok());
  EXPECT_EQ(redis_internal::ValidateClientName("two words").code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace idem::testing
