// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The provider's cases (provider_cases.cc) on a SQLite file, and its options
// that need no other store.
#include "http/provider_cases.h"

namespace idem::testing {
namespace {

std::string SqliteUrl(const TempDir& dir) { return "sqlite:" + dir.File("provider.db"); }

INSTANTIATE_TEST_SUITE_P(
    SQLite, ProviderTest,
    ::testing::Values(ProviderParam{"SQLite", SqliteUrl},
                      ProviderParam{"SQLiteOneTransaction", SqliteUrl, ProviderMode::kOneTransaction},
                      ProviderParam{"SQLiteGroupCommit", SqliteUrl, ProviderMode::kGroupCommit},
                      ProviderParam{"SQLiteGroupCommitOnFibers", SqliteUrl, ProviderMode::kGroupCommitOnFibers}),
    ProviderParamName);

TEST(ProviderServerStart, RefusesNoKeysAndAnUnopenableStore) {
  TempDir dir;
  auto none = cli::ProviderServer::Start({.store_url = "sqlite:" + dir.File("p.db")});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kInvalidArgument);
  auto nowhere = cli::ProviderServer::Start(
      {.store_url = "sqlite:" + dir.File("missing-dir/p.db"), .api_keys = {{"sk_a", "acct_a"}}});
  EXPECT_FALSE(nowhere.ok());
}

TEST(ProviderServerStart, ABusyPortIsUnavailable) {
  TempDir dir;
  auto first =
      cli::ProviderServer::Start({.store_url = "sqlite:" + dir.File("a.db"), .api_keys = {{"sk_a", "acct_a"}}});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = cli::ProviderServer::Start(
      {.port = (*first)->port(), .store_url = "sqlite:" + dir.File("b.db"), .api_keys = {{"sk_a", "acct_a"}}});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kUnavailable);
}

}  // namespace
}  // namespace idem::testing
