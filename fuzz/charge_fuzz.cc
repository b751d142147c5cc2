// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The demo provider's POST /charges body (tools/idem/charge.h). Properties:
// an accepted charge has a positive amount and a 3-character currency, and
// the charge written back as JSON is read as the same charge.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "charge.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  auto charge = idem::cli::ParseCharge(body);
  if (!charge.ok()) {
    if (charge.status().message().empty()) __builtin_trap();  // the 400's detail
    return 0;
  }
  if (charge->amount <= 0 || charge->currency.size() != 3) __builtin_trap();
  nlohmann::json j = {{"amount", charge->amount}, {"currency", charge->currency}};
  if (!charge->customer.empty()) j["customer"] = charge->customer;
  if (!charge->description.empty()) j["description"] = charge->description;
  // The strings came from a parsed body: valid UTF-8, so dump() cannot throw.
  auto again = idem::cli::ParseCharge(j.dump());
  if (!again.ok() || again->amount != charge->amount || again->currency != charge->currency ||
      again->customer != charge->customer || again->description != charge->description)
    __builtin_trap();
  return 0;
}
