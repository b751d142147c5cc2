// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// GoogleTest assertions for idem: a Status or Result that must be OK, and a
// handler that must be idempotent (idem/testing/harness.h). Include it after
// <gtest/gtest.h> in your tests; idem::testing does not link GoogleTest.
//
//   ASSERT_OK(store);                            // a Result<T>: on failure, its status
//   EXPECT_OK(tx->Commit());                     // a Status
//   EXPECT_IDEMPOTENT(harness, subject, messages);   // on failure, the Report
//
// Any other framework: `report.ok()` and `report.ToString()` say the same.
#ifndef IDEM_TESTING_GTEST_H_
#define IDEM_TESTING_GTEST_H_

#include <gtest/gtest.h>

#include <vector>

#include "idem/message.h"
#include "idem/result.h"
#include "idem/status.h"
#include "idem/testing/harness.h"

namespace idem::testing::internal {

inline const Status& StatusOf(const Status& s) { return s; }
template <typename T>
const Status& StatusOf(const Result<T>& r) {
  return r.status();
}

template <typename T>
::testing::AssertionResult IsOk(const char* text, const T& value) {
  const Status& s = StatusOf(value);
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << text << " is not OK: " << s.ToString();
}

inline ::testing::AssertionResult Idempotent(const char* harness_text, const char* subject_text, const char*,
                                             Harness& harness, const Subject& subject,
                                             const std::vector<Message>& messages) {
  Result<Report> report = harness.Run(subject, messages);
  if (!report.ok()) {
    return ::testing::AssertionFailure() << harness_text << " could not run " << subject_text << ": "
                                         << report.status().ToString();
  }
  if (report->ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << report->ToString();
}

}  // namespace idem::testing::internal

#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::idem::testing::internal::IsOk, expr)
#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::idem::testing::internal::IsOk, expr)
// Runs harness.Run(subject, messages); fails with the Report when a
// scenario broke the subject, or with the error when it could not run.
#define EXPECT_IDEMPOTENT(harness, subject, messages) \
  EXPECT_PRED_FORMAT3(::idem::testing::internal::Idempotent, harness, subject, messages)
#define ASSERT_IDEMPOTENT(harness, subject, messages) \
  ASSERT_PRED_FORMAT3(::idem::testing::internal::Idempotent, harness, subject, messages)

#endif  // IDEM_TESTING_GTEST_H_
