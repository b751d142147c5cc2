// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The shapes of the Idempotency-Key middleware's refusals (RefusalWriter):
// RFC 9457 problem+json, and Stripe's error object.
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "idem/http/idempotency.h"

namespace idem::http {

RefusalWriter ProblemJson(std::string problem_base) {
  return [base = std::move(problem_base)](const Refusal& r, Answer& ans) {
    nlohmann::json j = {{"type", base + "/" + std::string(r.type)},
                        {"title", r.title},
                        {"status", ans.status},
                        {"detail", r.detail},
                        {"retry", r.retry}};
    ans.SetBody(j.dump(), "application/problem+json");
  };
}

RefusalWriter StripeErrors() {
  return [](const Refusal& r, Answer& ans) {
    nlohmann::json error = {{"message", r.detail}};
    if (r.type == "idempotency-key-reused") {
      // Stripe answers a key reused with other parameters 400: its clients
      // raise StripeIdempotencyError for 400 + idempotency_error.
      ans.status = 400;
      error["type"] = "idempotency_error";
    } else if (ans.status == 429) {
      error["type"] = "rate_limit_error";
    } else if (ans.status >= 500) {
      error["type"] = "api_error";
    } else {
      error["type"] = "invalid_request_error";
    }
    if (r.type == "request-in-progress" || r.type == "lease-lost") error["code"] = "idempotency_key_in_use";
    // Stripe's clients retry 409 and 5xx on their own; the header says so
    // where a retry with the same key can help, and stops them elsewhere.
    const bool retry = r.retry == "same-key" && (ans.status == 409 || ans.status >= 500);
    ans.headers.Set("Stripe-Should-Retry", retry ? "true" : "false");
    ans.SetBody(nlohmann::json{{"error", std::move(error)}}.dump(), "application/json");
  };
}

}  // namespace idem::http
