// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The store conformance suite (test/store_conformance_test.cc) is written once
// and instantiated for every store: INSTANTIATE_TEST_SUITE_P(Name,
// StoreConformance, ::testing::Values(StoreParam{...})).
#ifndef IDEM_TEST_UTIL_STORE_CONFORMANCE_H_
#define IDEM_TEST_UTIL_STORE_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <cstdlib>
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

// The business writes of the suite's payments example, as the store takes
// them. Default: the SQL table of test_util.h (CreatePayments, an INSERT per
// charge, count(*)); a store that runs no SQL gives its own.
struct Payments {
  // Makes the store ready for payments (called after each open in SetUp).
  std::function<Status(Store&)> create = CreatePayments;
  // Writes one payment of `cents` for `message_id` in `tx`: no unique key,
  // so a repeated effect shows up as a second payment.
  std::function<Status(Transaction&, const std::string&, int64_t)> pay =
      [](Transaction& tx, const std::string& message_id, int64_t cents) {
        return tx.Exec("INSERT INTO payments(message_id, cents) VALUES ($1, $2)", {message_id, cents}).status();
      };
  // Payments for `message_id` ("" for all).
  std::function<int64_t(Store&, const std::string&)> count = [](Store& s, const std::string& id) {
    return Charges(s, id);
  };
};

struct StoreParam {
  std::string name;
  // Opens the store that belongs to `dir`: empty on the first call (a file
  // in the temp dir, a schema named after it); later calls, in this process
  // or a forked one, open the same store.
  std::function<Result<std::unique_ptr<Store>>(const TempDir&, Env*)> open;
  Payments payments{};
};

class StoreConformance : public ::testing::TestWithParam<StoreParam> {
 protected:
  void SetUp() override {
    auto s = GetParam().open(dir_, &env_);
    ASSERT_OK(s);
    store_ = std::move(*s);
    ASSERT_OK(GetParam().payments.create(*store_));
  }
  // ChargeHandler and Charges (test_util.h) on the store's payments.
  Handler Charge() const {
    return [pay = GetParam().payments.pay](Transaction& tx, const Message& m) -> Status {
      int64_t cents = std::atoll(m.payload.c_str());
      if (cents <= 0) cents = 4000;
      return pay(tx, m.id, cents);
    };
  }
  int64_t Paid(Store& store, const std::string& id = "") const { return GetParam().payments.count(store, id); }
  TempDir dir_;
  FakeEnv env_;
  std::unique_ptr<Store> store_;
};

// The cases that run SQL through the handler's Transaction (InsertLater,
// BEGIN/COMMIT refused, parameters, ApplyIfNewer's statements): instantiated
// for the SQL stores only (a store without SQL refuses Exec and Query; its
// own tests cover what stands for these).
class SqlStoreConformance : public StoreConformance {};

// Test names show the store's name, not the parameter's bytes.
inline void PrintTo(const StoreParam& p, std::ostream* os) { *os << p.name; }

inline std::string StoreParamName(const ::testing::TestParamInfo<StoreParam>& p) { return p.param.name; }

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_STORE_CONFORMANCE_H_
