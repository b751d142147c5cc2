// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The test kit on the handlers of handlers.h: what a user's own test file
// looks like. The corrected handlers pass EXPECT_IDEMPOTENT; each wrong one
// is caught, and its report is printed (run with --gtest_filter=Wrong.* to
// read them).
#include <gtest/gtest.h>

#include <iostream>

#include "handlers.h"
#include "idem/testing/gtest.h"

namespace {

using idem::testing::Context;
using idem::testing::Harness;
using idem::testing::Subject;

Harness::Options Payments() { return {.schema = payments::kSchema, .state_query = payments::kState}; }

TEST(Right, ChargeIsIdempotent) {
  Harness harness(Payments());
  Subject charge{.name = "charge", .handler = [](Context&) { return payments::Charge(); }};
  auto messages = payments::Messages();
  EXPECT_IDEMPOTENT(harness, charge, messages);
}

TEST(Right, ChargeCardWithItsKeyIsIdempotent) {
  Harness harness(Payments());
  Subject charge{.name = "charge-card", .call_first = [](Context& c) { return payments::ChargeCard(c, true); }};
  auto messages = payments::Messages(6);
  EXPECT_IDEMPOTENT(harness, charge, messages);
}

// Runs `subject` and expects the harness to catch it; prints the report.
void ExpectCaught(Harness::Options options, const Subject& subject) {
  Harness harness(std::move(options));
  auto report = harness.Run(subject, payments::Messages(6));
  ASSERT_OK(report);
  EXPECT_FALSE(report->ok());
  std::cout << *report << "\n";
}

TEST(Wrong, AnEffectOutsideTheTransaction) {
  Harness::Options o = Payments();
  o.state = payments::LedgerState;
  ExpectCaught(o, {.name = "outside-ledger", .handler = payments::ChargeWithOutsideLedger});
}

TEST(Wrong, ACallWithoutAKey) {
  ExpectCaught(Payments(), {.name = "no-key", .call_first = [](Context& c) { return payments::ChargeCard(c, false); }});
}

TEST(Wrong, AnIncrementWithoutAMarker) {
  ExpectCaught(Payments(), {.name = "no-marker", .consumer = payments::IncrementWithoutMarker});
}

TEST(Wrong, ADoubleEffectHiddenUntilTheThirdDelivery) {
  ExpectCaught(Payments(), {.name = "third-delivery", .consumer = payments::DedupeExceptOnThirdDelivery});
}

}  // namespace
