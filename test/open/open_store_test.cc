// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::OpenStore / idem::OpenClaimStore: a store by its URL, through the
// adapter's ParseUrl then Open; bad URLs name what is wrong.
#include "idem/open.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "idem/claims.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

TEST(OpenStore, SqliteByUrlOrBarePath) {
  TempDir dir;
  for (const std::string& url :
       {"sqlite:" + dir.File("a.db") + "?synchronous=normal", dir.File("b.db"), "sqlite://" + dir.File("c.db")}) {
    auto store = OpenStore(url);
    ASSERT_TRUE(store.ok()) << url << ": " << store.status();
    EXPECT_EQ((*store)->Kind(), "sqlite");
    ASSERT_NE((*store)->claim_store(), nullptr);
  }
  // A URL's bad key is the adapter's error.
  auto bad = OpenStore("sqlite:" + dir.File("d.db") + "?colour=red");
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("colour"), std::string::npos) << bad.status();
}

TEST(OpenStore, CreateIfMissingFromSettingsOrUrl) {
  TempDir dir;
  EXPECT_FALSE(OpenStore("sqlite:" + dir.File("none.db"), {.create_if_missing = false}).ok());
  EXPECT_FALSE(OpenStore("sqlite:" + dir.File("none.db") + "?create_if_missing=false").ok());
  EXPECT_FALSE(std::filesystem::exists(dir.File("none.db")));
  ASSERT_TRUE(OpenStore("sqlite:" + dir.File("made.db")).ok());
  EXPECT_TRUE(OpenStore("sqlite:" + dir.File("made.db"), {.create_if_missing = false}).ok());
}

TEST(OpenStore, BadUrlsAreNamedWithTheirPasswordHidden) {
  auto unknown = OpenStore("mysql://app:s3cret@db/orders");
  EXPECT_EQ(unknown.status().code(), Code::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("not a store URL"), std::string::npos) << unknown.status();
  EXPECT_EQ(unknown.status().message().find("s3cret"), std::string::npos) << unknown.status();
  auto scheme_like = OpenStore("mysql:orders");
  EXPECT_NE(scheme_like.status().message().find("not a store URL: 'mysql:orders'"), std::string::npos)
      << scheme_like.status();
  // Redis keeps claims only.
  auto redis = OpenStore("redis://:s3cret@127.0.0.1:1");
  EXPECT_EQ(redis.status().code(), Code::kInvalidArgument);
  EXPECT_NE(redis.status().message().find("OpenClaimStore"), std::string::npos) << redis.status();
  EXPECT_EQ(redis.status().message().find("s3cret"), std::string::npos) << redis.status();
  EXPECT_EQ(OpenClaimStore("mysql:orders").status().code(), Code::kInvalidArgument);
}

TEST(OpenClaimStore, ASqlUrlsClaimStoreOwnsItsStore) {
  TempDir dir;
  auto claims_store = OpenClaimStore("sqlite:" + dir.File("claims.db"));
  ASSERT_OK(claims_store);
  // The Store it lives in is owned by it: claims work after the call returned.
  Claims claims(**claims_store);
  auto c = claims.Claim({.scope = "charges", .key = "k1", .fingerprint = FingerprintOf("body")});
  ASSERT_OK(c);
  EXPECT_EQ(c->kind, ClaimOutcome::Kind::kStarted);
  ASSERT_TRUE(claims.Complete(c->token, "receipt").ok());
  auto replay = claims.Claim({.scope = "charges", .key = "k1", .fingerprint = FingerprintOf("body")});
  ASSERT_OK(replay);
  EXPECT_EQ(replay->kind, ClaimOutcome::Kind::kCompleted);
  EXPECT_EQ(replay->result, "receipt");
  auto rec = (*claims_store)->FindClaim("charges", "k1");
  ASSERT_TRUE(rec.ok() && rec->has_value());
}

TEST(OpenStore, SchemesListSqlite) {
  auto schemes = StoreSchemes();
  EXPECT_NE(std::find(schemes.begin(), schemes.end(), "sqlite"), schemes.end());
}

}  // namespace
}  // namespace idem::testing
