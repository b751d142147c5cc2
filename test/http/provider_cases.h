// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The provider (tools/idem ProviderServer: POST /charges behind the
// Idempotency-Key middleware, GET /charges...) over loopback, written once in
// provider_cases.cc and instantiated per store:
//   INSTANTIATE_TEST_SUITE_P(SQLite, ProviderTest, ::testing::Values(ProviderParam{...}), ProviderParamName);
#ifndef IDEM_TEST_HTTP_PROVIDER_CASES_H_
#define IDEM_TEST_HTTP_PROVIDER_CASES_H_

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "http/http_test_util.h"
#include "provider_server.h"
#include "util/test_util.h"

namespace idem::testing {

// How POST /charges commits: two-phase (the default), in one transaction per
// request (--one-transaction), or in groups (--group-commit), with the
// connections as fibers (--fibers) or not.
enum class ProviderMode { kTwoPhase, kOneTransaction, kGroupCommit, kGroupCommitOnFibers };

struct ProviderParam {
  std::string name;
  // The URL of an empty store for one test (called once per test; the
  // provider is restarted on the same URL).
  std::function<std::string(const TempDir&)> store_url;
  ProviderMode mode = ProviderMode::kTwoPhase;
};
inline void PrintTo(const ProviderParam& p, std::ostream* os) { *os << p.name; }
inline std::string ProviderParamName(const ::testing::TestParamInfo<ProviderParam>& p) { return p.param.name; }

class ProviderTest : public ::testing::TestWithParam<ProviderParam> {
 protected:
  void SetUp() override { url_ = GetParam().store_url(dir_); }
  void TearDown() override {
    if (provider_) provider_->Stop();
  }

  cli::ProviderServerOptions Options() {
    cli::ProviderServerOptions o;
    o.store_url = url_;
    o.api_keys = {{"sk_a", "acct_a"}, {"sk_b", "acct_b"}};
    o.threads = 128;
    o.one_transaction = GetParam().mode != ProviderMode::kTwoPhase;
    if (GetParam().mode == ProviderMode::kGroupCommit || GetParam().mode == ProviderMode::kGroupCommitOnFibers)
      o.idempotency.group_commit_max = 64;
    if (GetParam().mode == ProviderMode::kGroupCommitOnFibers) o.fibers = 2;
    return o;
  }
  void Start(cli::ProviderServerOptions o) {
    auto p = cli::ProviderServer::Start(std::move(o));
    ASSERT_OK(p);
    provider_ = std::move(*p);
  }
  void Start() { Start(Options()); }
  bool transactional() const { return GetParam().mode != ProviderMode::kTwoPhase; }

  Reply Charge(const std::string& key, const std::string& body, const std::string& bearer = "sk_a") {
    return Send(provider_->port(), "POST", "/charges", Headers(bearer, Quoted(key)), body);
  }
  Reply Get(const std::string& path, const std::string& bearer = "sk_a") {
    return Send(provider_->port(), "GET", path, Headers(bearer, std::nullopt));
  }
  // The principal's charges (GET /charges).
  nlohmann::json Charges(const std::string& bearer = "sk_a") {
    Reply r = Get("/charges", bearer);
    EXPECT_EQ(r.status, 200) << r.body;
    auto j = r.json();
    return j.is_object() ? j["data"] : nlohmann::json::array();
  }

  TempDir dir_;
  std::string url_;
  std::unique_ptr<cli::ProviderServer> provider_;
};

}  // namespace idem::testing

#endif  // IDEM_TEST_HTTP_PROVIDER_CASES_H_
