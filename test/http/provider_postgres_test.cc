// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The provider's cases (provider_cases.cc) on PostgreSQL: a fresh schema of
// the throwaway server (CTest fixture "postgres") per test.
#include "http/provider_cases.h"
#include "postgres/pg_test_util.h"

namespace idem::testing {
namespace {

std::string Url(const TempDir&) { return FreshSchemaUrl(); }

INSTANTIATE_TEST_SUITE_P(Postgres, ProviderTest,
                         ::testing::Values(ProviderParam{"Postgres", Url},
                                           ProviderParam{"PostgresOneTransaction", Url, ProviderMode::kOneTransaction},
                                           ProviderParam{"PostgresGroupCommit", Url, ProviderMode::kGroupCommit}),
                         ProviderParamName);

}  // namespace
}  // namespace idem::testing
