// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The provider's cases (provider_cases.cc) on PostgreSQL behind pgbouncer in
// transaction mode (CTest fixture "pgbouncer"): a fresh schema, and a role
// whose search_path it is, per test; the store finds the pooler by itself.
// Two-phase and group commit (a group's claims and stored responses
// pipelined in one transaction).
#include "http/provider_cases.h"
#include "postgres/pg_test_util.h"

namespace idem::testing {
namespace {

std::string Url(const TempDir&) { return FreshPooledSchemaUrl(); }

INSTANTIATE_TEST_SUITE_P(Pgbouncer, ProviderTest,
                         ::testing::Values(ProviderParam{"Pgbouncer", Url},
                                           ProviderParam{"PgbouncerGroupCommit", Url, ProviderMode::kGroupCommit}),
                         ProviderParamName);

}  // namespace
}  // namespace idem::testing
