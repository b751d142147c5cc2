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
#include <string>

#include "idem/claims.h"
#include "idem/env.h"
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

inline void PrintTo(const ClaimsParam& p, std::ostream* os) { *os << p.name; }
inline std::string ClaimsParamName(const ::testing::TestParamInfo<ClaimsParam>& p) { return p.param.name; }

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_CLAIMS_CONFORMANCE_H_
