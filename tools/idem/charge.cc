// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "charge.h"

#include "idem/http/idempotency.h"
#include "idem/http/stored_response.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

namespace idem::cli {

Result<ChargeFields> ParseCharge(std::string_view text) {
  // A member given twice is refused: which one a reader takes differs
  // between parsers, and a charge must mean one amount.
  std::vector<std::set<std::string>> members;  // per open object
  std::string twice;
  const nlohmann::json::parser_callback_t watch = [&](int, nlohmann::json::parse_event_t event,
                                                      nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::object_start) members.emplace_back();
    if (event == nlohmann::json::parse_event_t::object_end && !members.empty()) members.pop_back();
    if (event == nlohmann::json::parse_event_t::key && !members.empty() &&
        !members.back().insert(parsed.get<std::string>()).second && twice.empty())
      twice = parsed.get<std::string>();
    return true;
  };
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(text, watch);
  } catch (const nlohmann::json::exception& e) {  // the parser's message says where
    return Status::InvalidArgument(std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) return Status::InvalidArgument("the body must be a JSON object");
  if (!twice.empty()) return Status::InvalidArgument("the member \"" + twice + "\" is given twice");
  auto amount = body.find("amount");
  auto currency = body.find("currency");
  if (amount == body.end() || !amount->is_number_integer() || amount->get<int64_t>() <= 0)
    return Status::InvalidArgument("amount must be a positive integer (cents)");
  if (currency == body.end() || !currency->is_string() || currency->get<std::string>().size() != 3)
    return Status::InvalidArgument("currency must be a 3-letter code");
  ChargeFields f{amount->get<int64_t>(), currency->get<std::string>(), "", ""};
  for (auto [name, field] : {std::pair{"customer", &f.customer}, std::pair{"description", &f.description}}) {
    auto it = body.find(name);
    if (it == body.end()) continue;
    if (!it->is_string()) return Status::InvalidArgument(std::string(name) + " must be a string");
    *field = it->get<std::string>();
  }
  return f;
}

Result<ChargeFields> ParseStripeCharge(std::string_view body, std::string* param) {
  param->clear();
  auto pairs = http::ParseForm(body);
  if (!pairs.ok()) return Status::InvalidArgument("Invalid form body: " + pairs.status().message());
  ChargeFields f;
  std::set<std::string> seen;
  bool have_amount = false, have_currency = false;
  for (auto& [name, value] : *pairs) {
    *param = name;
    if (!seen.insert(name).second)
      return Status::InvalidArgument("Received the parameter " + Printable(name, 64) + " twice");
    if (name == "amount") {
      int64_t amount = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), amount);
      if (value.empty() || value[0] == '-' || ec != std::errc() || end != value.data() + value.size() || amount <= 0)
        return Status::InvalidArgument("Invalid positive integer: amount must be a positive integer (cents)");
      f.amount = amount;
      have_amount = true;
    } else if (name == "currency") {
      if (value.size() != 3 ||
          !std::all_of(value.begin(), value.end(), [](unsigned char c) { return std::isalpha(c); }))
        return Status::InvalidArgument("Invalid currency: " + Printable(value, 16) + " (a 3-letter ISO code)");
      for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      f.currency = std::move(value);
      have_currency = true;
    } else if (name == "customer") {
      f.customer = std::move(value);
    } else if (name == "description") {
      f.description = std::move(value);
    } else {
      return Status::InvalidArgument("Received unknown parameter: " + Printable(name, 64) +
                                     " (this provider takes amount, currency, customer and description)");
    }
  }
  for (auto [have, name] : {std::pair{have_amount, "amount"}, std::pair{have_currency, "currency"}}) {
    if (!have) {
      *param = name;
      return Status::InvalidArgument(std::string("Missing required param: ") + name + ".");
    }
  }
  param->clear();
  return f;
}

}  // namespace idem::cli
