// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The claims conformance suite (test/claims_conformance_test.cc) is written
// once and instantiated for every ClaimStore:
//   INSTANTIATE_TEST_SUITE_P(Name, ClaimsConformance,
//                            ::testing::Values(ClaimsParam{...}), ClaimsParamName);
// The store's clock must be the FakeEnv it is given (leases expire when the
// test advances it; nothing sleeps).
#ifndef IDEM_TEST_UTIL_CLAIMS_CONFORMANCE_H_
#define IDEM_TEST_UTIL_CLAIMS_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "idem/claims.h"
#include "idem/env.h"
#include "idem/message.h"
#include "idem/store.h"
#include "idem/testing/fake_env.h"
#include "util/test_util.h"

namespace idem::testing {

struct ClaimsParam {
  std::string name;
  // Opens an empty claim store for `dir` whose clock is `env`; later calls
  // with the same dir (in this process or a forked one) open the same store.
  std::function<Result<std::shared_ptr<ClaimStore>>(const TempDir&, Env*)> open;
};

class ClaimsConformance : public ::testing::TestWithParam<ClaimsParam> {
 protected:
  void SetUp() override {
    auto s = GetParam().open(dir_, &env_);
    ASSERT_OK(s);
    store_ = std::move(*s);
  }
  TempDir dir_;
  FakeEnv env_;
  std::shared_ptr<ClaimStore> store_;
};

// The claim store of an opened SQL store, owning it.
inline Result<std::shared_ptr<ClaimStore>> ClaimsOf(Result<std::unique_ptr<Store>> opened) {
  if (!opened.ok()) return opened.status();
  std::shared_ptr<Store> store(std::move(*opened));
  ClaimStore* claims = store->claim_store();
  if (claims == nullptr) return Status::Internal(std::string(store->Kind()) + " store has no claim store");
  return std::shared_ptr<ClaimStore>(store, claims);
}

// The claims of the stores' flight tests (claims outside a transaction
// that share a commit): scope "group", a live lease.
inline ClaimRequest GroupRequest(const std::string& key) {
  return ClaimRequest{.scope = "group", .key = key, .fingerprint = FingerprintOf("b"), .lease_ms = 60'000};
}

// `got`, claims that shared commits, answered each as alone: `started` of
// them started, each with a fence of its own, and are completed here with
// "done <key>"; the rest (a key claimed twice) are in progress. Then each
// of `replayed` is claimed again and answered with its stored result.
inline void ExpectAnsweredAsAlone(Claims& claims, const std::vector<Result<ClaimOutcome>>& got, int started,
                                  const std::vector<std::string>& replayed) {
  std::set<int64_t> fences;
  int n_started = 0, in_progress = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_OK(got[i]);
    if (got[i]->kind == ClaimOutcome::Kind::kStarted) {
      ++n_started;
      fences.insert(got[i]->token.fence);
      ASSERT_OK(claims.Complete(got[i]->token, "done " + got[i]->token.key));
    } else {
      EXPECT_EQ(got[i]->kind, ClaimOutcome::Kind::kInProgress);  // claimed twice together
      ++in_progress;
    }
  }
  EXPECT_EQ(n_started, started);
  EXPECT_EQ(in_progress, static_cast<int>(got.size()) - started);
  EXPECT_EQ(fences.size(), static_cast<size_t>(started));
  for (const std::string& key : replayed) {
    auto again = claims.Claim(GroupRequest(key));
    ASSERT_OK(again);
    EXPECT_EQ(again->kind, ClaimOutcome::Kind::kCompleted) << key;
    EXPECT_EQ(again->result, "done " + key);
  }
}

inline void PrintTo(const ClaimsParam& p, std::ostream* os) { *os << p.name; }
inline std::string ClaimsParamName(const ::testing::TestParamInfo<ClaimsParam>& p) { return p.param.name; }

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_CLAIMS_CONFORMANCE_H_
