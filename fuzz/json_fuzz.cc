// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Canonical JSON and the request fingerprint (http::CanonicalJson,
// http::RequestFingerprint) on any body. Properties: the canonical form is
// stable (canonicalising it gives the same bytes), and the fingerprint does
// not depend on object key order or whitespace (the parsed body written back
// with every object's keys in reverse order, spaced, has the same one).
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/http/idempotency.h"
#include "idem/http/stored_response.h"

namespace {

// `j` as JSON text with each object's members in reverse key order and a
// space after every separator.
void WriteReversed(const nlohmann::json& j, std::string& out) {
  if (j.is_object()) {
    out += "{ ";
    std::vector<std::pair<std::string, const nlohmann::json*>> members;
    for (auto it = j.begin(); it != j.end(); ++it) members.emplace_back(it.key(), &it.value());
    for (size_t i = members.size(); i-- > 0;) {
      out += nlohmann::json(members[i].first).dump() + " : ";
      WriteReversed(*members[i].second, out);
      if (i > 0) out += " , ";
    }
    out += " }";
  } else if (j.is_array()) {
    out += "[ ";
    for (size_t i = 0; i < j.size(); ++i) {
      if (i > 0) out += " , ";
      WriteReversed(j[i], out);
    }
    out += " ]";
  } else {
    out += j.dump();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const idem::Fingerprint fp = idem::http::RequestFingerprint("POST", "/charges", body);
  const std::optional<std::string> canonical = idem::http::CanonicalJson(body);
  if (!canonical) return 0;
  const std::optional<std::string> twice = idem::http::CanonicalJson(*canonical);
  if (!twice || *twice != *canonical) __builtin_trap();
  if (idem::http::RequestFingerprint("POST", "/charges", *canonical) != fp) __builtin_trap();
  nlohmann::json parsed = nlohmann::json::parse(*canonical, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) __builtin_trap();
  std::string reversed;
  WriteReversed(parsed, reversed);
  if (idem::http::RequestFingerprint("POST", "/charges", reversed) != fp) __builtin_trap();
  return 0;
}
