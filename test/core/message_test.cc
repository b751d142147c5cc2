// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/kill_point.h"
#include "idem/env.h"
#include "idem/message.h"
#include "idem/result.h"
#include "idem/status.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/kill_points.h"

namespace idem {
namespace {

TEST(Message, IdValidation) {
  EXPECT_TRUE(ValidateId("m-7f3").ok());
  EXPECT_TRUE(ValidateId(std::string(255, 'a')).ok());
  Status empty = ValidateId("");
  EXPECT_EQ(empty.code(), Code::kInvalidArgument);
  EXPECT_NE(empty.message().find("empty"), std::string::npos);
  Status long_id = ValidateId(std::string(256, 'a'));
  EXPECT_EQ(long_id.code(), Code::kInvalidArgument);
  EXPECT_NE(long_id.message().find("256"), std::string::npos) << long_id;
}

TEST(Message, FingerprintIsSha256) {
  // SHA-256("abc"), FIPS 180-2 test vector.
  EXPECT_EQ(ToHex(FingerprintOf("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_NE(FingerprintOf("4000"), FingerprintOf("4001"));
}

TEST(Message, DownstreamKeyIsStablePerStep) {
  Message m;
  m.id = "m-7f3";
  EXPECT_EQ(DownstreamKey(m, "charge"), "m-7f3:charge");
  EXPECT_NE(DownstreamKey(m, "charge"), DownstreamKey(m, "email"));
  m.attempt = 5;  // a redelivery: same key
  EXPECT_EQ(DownstreamKey(m, "charge"), "m-7f3:charge");
}

// Every id a Message accepts gets a key a header can carry, of at most
// kMaxKeyBytes, the same on every call, distinct per id and per step.
TEST(Message, DownstreamKeyFitsEveryValidId) {
  const std::string utf8 = "commande-\xc3\xa9t\xc3\xa9-1042";  // "commande-été-1042"
  std::vector<std::string> ids = {"a",
                                  std::string(249, 'x'),
                                  std::string(255, 'y'),
                                  std::string(255, 'x'),
                                  utf8,
                                  "order 1042",
                                  "with \"quotes\" and \\",
                                  std::string("nul\0byte", 8),
                                  std::string(kHashedKeyPrefix) + "abc",
                                  "abc"};
  std::set<std::string> keys;
  for (const std::string& id : ids) {
    ASSERT_TRUE(ValidateId(id).ok()) << id;
    const std::string key = DownstreamKey(id, "charge");
    EXPECT_LE(key.size(), kMaxKeyBytes) << Printable(id);
    for (unsigned char c : key) EXPECT_TRUE(c >= 0x20 && c <= 0x7E) << Printable(key);
    EXPECT_TRUE(key.ends_with(":charge")) << key;
    EXPECT_EQ(key, DownstreamKey(id, "charge")) << "stable";
    EXPECT_NE(key, DownstreamKey(id, "refund"));
    keys.insert(key);
  }
  EXPECT_EQ(keys.size(), ids.size()) << "one key per id";
  // The short printable ids keep the readable form; the others are hashed.
  EXPECT_EQ(DownstreamKey("a", "charge"), "a:charge");
  EXPECT_EQ(DownstreamKey("order 1042", "charge"), "order 1042:charge");
  EXPECT_EQ(DownstreamKey(std::string(248, 'x'), "charge"), std::string(248, 'x') + ":charge");  // 255 bytes
  EXPECT_TRUE(DownstreamKey(std::string(249, 'x'), "charge").starts_with(kHashedKeyPrefix));
  EXPECT_TRUE(DownstreamKey(std::string(255, 'y'), "charge").starts_with(kHashedKeyPrefix));
  EXPECT_TRUE(DownstreamKey(utf8, "charge").starts_with(kHashedKeyPrefix));
  // An id that looks like a hashed key is hashed too, so the forms never meet.
  EXPECT_TRUE(
      DownstreamKey(std::string(kHashedKeyPrefix) + "abc", "charge")
          .starts_with(std::string(kHashedKeyPrefix) + ToHex(FingerprintOf(std::string(kHashedKeyPrefix) + "abc"))));
}

TEST(Message, StepNamesAreChecked) {
  EXPECT_TRUE(ValidateStep("charge").ok());
  EXPECT_EQ(ValidateStep("").code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateStep("two words").code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateStep(std::string(kMaxStepBytes + 1, 's')).code(), Code::kInvalidArgument);
  EXPECT_EQ(Printable(std::string("a\x01\\", 3)), "a\\x01\\x5c");
}

TEST(Message, Headers) {
  Message m;
  m.headers = {{"a", "1"}, {"b", "2"}, {"a", "3"}};
  EXPECT_EQ(*m.Header("a"), "1");
  EXPECT_FALSE(m.Header("c").has_value());
}

TEST(Status, CodesAndContext) {
  EXPECT_TRUE(Status::OK().ok());
  EXPECT_EQ(Status::OK().ToString(), "ok");
  Status s = Status::Busy("locked").WithContext("COMMIT");
  EXPECT_EQ(s.code(), Code::kBusy);
  EXPECT_EQ(s.ToString(), "busy: COMMIT: locked");
  EXPECT_TRUE(s.IsTransient());
  EXPECT_FALSE(Status::InvalidArgument("x").IsTransient());
  EXPECT_EQ(CodeName(Code::kInDoubt), "in_doubt");
}

TEST(Result, ValueOrStatus) {
  Result<int> good = 7;
  EXPECT_TRUE(good.ok());
  EXPECT_EQ(*good, 7);
  Result<int> bad = Status::NotFound("nope");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kNotFound);
}

TEST(Env, FakeClockAdvancesOnSleep) {
  FakeEnv env(1000);
  env.SleepMs(250);
  EXPECT_EQ(env.NowMs(), 1250);
  FakeEnv a(0, 7), b(0, 7);
  EXPECT_EQ(a.Random(), b.Random());
}

TEST(KillPoints, ArmedPointRunsItsActionOnTheNthHit) {
  int fired = 0;
  ArmKillPoint("test.point", 2, [&] { ++fired; });
  IDEM_KILL_POINT("test.other");
  IDEM_KILL_POINT("test.point");
  EXPECT_EQ(fired, 0);
  IDEM_KILL_POINT("test.point");
  EXPECT_EQ(fired, 1);
  IDEM_KILL_POINT("test.point");
  EXPECT_EQ(fired, 1);
  DisarmKillPoints();
}

}  // namespace
}  // namespace idem
