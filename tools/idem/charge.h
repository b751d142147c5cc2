// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The body of the demo provider's POST /charges (provider_server.cc), read
// without the server: the fuzz target fuzz/charge_fuzz.cc links it alone.
#ifndef IDEM_TOOLS_IDEM_CHARGE_H_
#define IDEM_TOOLS_IDEM_CHARGE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "idem/result.h"

namespace idem::cli {

// A charge's fields.
struct ChargeFields {
  int64_t amount = 0;  // cents, > 0
  std::string currency, customer, description;
};

// The charge a JSON body asks for: an object with a positive integer
// "amount", a 3-character string "currency", and optional string "customer"
// and "description"; no member given twice in any object. kInvalidArgument,
// whose message is the 400 problem's detail, for anything else.
Result<ChargeFields> ParseCharge(std::string_view body);

// The charge a form body asks for, as Stripe's client libraries send
// POST /v1/charges (application/x-www-form-urlencoded): "amount" (a positive
// integer, cents), "currency" (3 letters, lower-cased as Stripe does),
// optional "customer" and "description"; no parameter given twice, no other
// parameter. kInvalidArgument with Stripe's wording ("Missing required
// param: amount.", "Received unknown parameter: x") and `*param` set to the
// parameter it is about.
Result<ChargeFields> ParseStripeCharge(std::string_view body, std::string* param);

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_CHARGE_H_
