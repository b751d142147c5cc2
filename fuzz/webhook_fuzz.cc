// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The webhook parsers (idem/http/webhook.h) and ids from payloads
// (idem/id_from.h) on any delivery. Input: a first byte choosing the scheme
// (standard, github, stripe), then "Name: value" header lines up to an empty
// line, then the body. The clock stands at the seeds' timestamp
// (1700000000). Properties: Verify either verifies or refuses with
// kInvalidArgument (not a webhook) or kRejected (a signature or timestamp
// that does not hold), never anything else; a verified event has a valid id;
// what SignWebhook signs again for that id, timestamp and body verifies too.
// A header "x-id-from: SPEC" is parsed as an IdFrom spec and applied to the
// body as the payload: an id it extracts is a valid one.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "idem/http/webhook.h"
#include "idem/id_from.h"
#include "idem/testing/fake_env.h"

namespace {

using idem::http::WebhookScheme;

constexpr const char* kSecrets[] = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "gh-secret", "whsec_stripe"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static idem::FakeEnv clock(1'700'000'000'000);
  const WebhookScheme scheme = static_cast<WebhookScheme>(data[0] % 3);
  const char* secret = kSecrets[data[0] % 3];
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  idem::http::Request r{.method = "POST", .path = "/webhooks"};
  std::string id_from;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (line.empty()) break;
    const size_t colon = line.find(": ");
    if (colon == std::string_view::npos) continue;
    const std::string name(line.substr(0, colon)), value(line.substr(colon + 2));
    if (name == "x-id-from") id_from = value;
    r.headers.Add(name, value);
  }
  r.body = std::string(rest);

  static auto verifier =
      std::move(idem::http::WebhookVerifier::Open({.scheme = scheme, .secrets = {secret}, .env = &clock}).value());
  static WebhookScheme verifier_scheme = scheme;
  if (verifier_scheme != scheme) {
    verifier =
        std::move(idem::http::WebhookVerifier::Open({.scheme = scheme, .secrets = {secret}, .env = &clock}).value());
    verifier_scheme = scheme;
  }
  auto ev = verifier->Verify(r);
  if (!ev.ok()) {
    if (!ev.status().IsInvalidArgument() && !ev.status().IsRejected()) __builtin_trap();
  } else {
    if (!idem::ValidateId(ev->id).ok()) __builtin_trap();
    const int64_t ts = ev->timestamp_s >= 0 ? ev->timestamp_s : 1'700'000'000;
    auto again = idem::http::SignWebhook(scheme, secret, ev->id, ts, r.body);
    if (!again.ok()) __builtin_trap();
    idem::http::Request resigned{.method = "POST", .path = "/webhooks", .headers = *again, .body = r.body};
    auto ev2 = verifier->Verify(resigned);
    if (!ev2.ok() || ev2->id != ev->id) __builtin_trap();
  }

  if (!id_from.empty()) {
    auto spec = idem::IdFrom::Parse(id_from);
    if (spec.ok()) {
      idem::Message m{.id = "source-id", .payload = r.body};
      for (const auto& [name, value] : r.headers) m.headers.emplace_back(name, value);
      auto id = spec->Extract(m);
      if (id.ok() && !idem::ValidateId(*id).ok()) __builtin_trap();
      if (!id.ok() && !id.status().IsRejected() && !id.status().IsInvalidArgument()) __builtin_trap();
    } else if (!spec.status().IsInvalidArgument()) {
      __builtin_trap();
    }
  }
  return 0;
}
