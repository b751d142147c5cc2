// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The store conformance suite (test/store_conformance_test.cc) is written once
// and instantiated for every store: INSTANTIATE_TEST_SUITE_P(Name,
// StoreConformance, ::testing::Values(StoreParam{...})).
#ifndef IDEM_TEST_UTIL_STORE_CONFORMANCE_H_
#define IDEM_TEST_UTIL_STORE_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "idem/env.h"
#include "idem/inbox.h"
#include "idem/store.h"
#include "idem/store_backend.h"
#include "idem/testing/fake_env.h"
#include "util/test_util.h"

namespace idem::testing {

struct StoreParam {
  std::string name;
  // Opens the store that belongs to `dir`: empty on the first call (a file
  // in the temp dir, a schema named after it); later calls, in this process
  // or a forked one, open the same store.
  std::function<Result<std::unique_ptr<Store>>(const TempDir&, Env*)> open;
};

class StoreConformance : public ::testing::TestWithParam<StoreParam> {
 protected:
  void SetUp() override {
    auto s = GetParam().open(dir_, &env_);
    ASSERT_OK(s);
    store_ = std::move(*s);
    ASSERT_TRUE(CreatePayments(*store_).ok());
  }
  TempDir dir_;
  FakeEnv env_;
  std::unique_ptr<Store> store_;
};

// Test names show the store's name, not the parameter's bytes.
inline void PrintTo(const StoreParam& p, std::ostream* os) { *os << p.name; }

inline std::string StoreParamName(const ::testing::TestParamInfo<StoreParam>& p) { return p.param.name; }

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_STORE_CONFORMANCE_H_
