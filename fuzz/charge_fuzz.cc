// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The demo provider's POST /charges body and its Stripe dialect's form body
// (tools/idem/charge.h), and the form canonicalisation of the fingerprint.
// Properties: an accepted charge has a positive amount and a 3-character
// currency, and the charge written back (as JSON, as a form) is read as the
// same charge; a refusal names its problem; a canonical form body is its own
// canonical form.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "charge.h"
#include "idem/http/idempotency.h"
#include "idem/http/stored_response.h"
#include "idem/url.h"

namespace {

void CheckStripeForm(std::string_view body) {
  std::string param;
  auto charge = idem::cli::ParseStripeCharge(body, &param);
  if (!charge.ok()) {
    if (charge.status().message().empty()) __builtin_trap();
    return;
  }
  if (charge->amount <= 0 || charge->currency.size() != 3 || !param.empty()) __builtin_trap();
  for (const char c : charge->currency)
    if (c < 'a' || c > 'z') __builtin_trap();
  std::string again_body = "amount=" + std::to_string(charge->amount) + "&currency=" + charge->currency;
  if (!charge->customer.empty() || body.find("customer") != std::string_view::npos)
    again_body += "&customer=" + idem::PercentEncode(charge->customer);
  if (!charge->description.empty() || body.find("description") != std::string_view::npos)
    again_body += "&description=" + idem::PercentEncode(charge->description);
  auto again = idem::cli::ParseStripeCharge(again_body, &param);
  if (!again.ok() || again->amount != charge->amount || again->currency != charge->currency ||
      again->customer != charge->customer || again->description != charge->description)
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  CheckStripeForm(body);
  if (auto canonical = idem::http::CanonicalForm(body)) {
    if (idem::http::CanonicalForm(*canonical) != canonical) __builtin_trap();
  }
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
