// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Status: one factory and one predicate per code, and they agree.
#include "idem/status.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

namespace idem {
namespace {

struct CodeCase {
  Code code;
  Status (*make)(std::string);
  bool (Status::*is)() const noexcept;
};

const std::vector<CodeCase>& Cases() {
  static const std::vector<CodeCase> cases = {
      {Code::kInvalidArgument, &Status::InvalidArgument, &Status::IsInvalidArgument},
      {Code::kNotFound, &Status::NotFound, &Status::IsNotFound},
      {Code::kDuplicate, &Status::Duplicate, &Status::IsDuplicate},
      {Code::kConflict, &Status::Conflict, &Status::IsConflict},
      {Code::kInProgress, &Status::InProgress, &Status::IsInProgress},
      {Code::kBusy, &Status::Busy, &Status::IsBusy},
      {Code::kRetryable, &Status::Retryable, &Status::IsRetryable},
      {Code::kUnavailable, &Status::Unavailable, &Status::IsUnavailable},
      {Code::kInDoubt, &Status::InDoubt, &Status::IsInDoubt},
      {Code::kCorruption, &Status::Corruption, &Status::IsCorruption},
      {Code::kSchemaMismatch, &Status::SchemaMismatch, &Status::IsSchemaMismatch},
      {Code::kIoError, &Status::IoError, &Status::IsIoError},
      {Code::kHandlerFailed, &Status::HandlerFailed, &Status::IsHandlerFailed},
      {Code::kLeaseLost, &Status::LeaseLost, &Status::IsLeaseLost},
      {Code::kAborted, &Status::Aborted, &Status::IsAborted},
      {Code::kInternal, &Status::Internal, &Status::IsInternal},
      {Code::kRejected, &Status::Rejected, &Status::IsRejected},
  };
  return cases;
}

TEST(StatusTest, EveryCodeHasAFactoryAndAPredicate) {
  // Every code but kOk is listed once.
  EXPECT_EQ(Cases().size(), static_cast<size_t>(Code::kRejected));
  for (const CodeCase& c : Cases()) {
    Status s = c.make("why");
    EXPECT_EQ(s.code(), c.code) << CodeName(c.code);
    EXPECT_EQ(s.message(), "why");
    EXPECT_EQ(s.ToString(), std::string(CodeName(c.code)) + ": why");
    for (const CodeCase& other : Cases())
      EXPECT_EQ((s.*other.is)(), other.code == c.code) << CodeName(c.code) << " vs " << CodeName(other.code);
    EXPECT_FALSE((Status::OK().*c.is)()) << CodeName(c.code);
  }
}

TEST(StatusTest, ContextKeepsTheCode) {
  Status s = Status::LeaseLost("taken over").WithContext("complete");
  EXPECT_TRUE(s.IsLeaseLost());
  EXPECT_EQ(s.message(), "complete: taken over");
  EXPECT_TRUE(Status::OK().WithContext("x").ok());
}

}  // namespace
}  // namespace idem
