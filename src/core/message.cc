// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/message.h"

#include <openssl/evp.h>

#include <string>

namespace idem {

std::optional<std::string_view> Message::Header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return std::string_view(v);
  return std::nullopt;
}

Status ValidateId(std::string_view id) {
  if (id.empty()) return Status::InvalidArgument("message id is empty: the producer must assign a stable id");
  if (id.size() > kMaxIdBytes)
    return Status::InvalidArgument("message id is " + std::to_string(id.size()) + " bytes, longer than the " +
                                   std::to_string(kMaxIdBytes) + "-byte limit");
  return Status::OK();
}

Fingerprint FingerprintOf(std::string_view payload) {
  Fingerprint fp{};
  unsigned int len = 0;
  // EVP_Digest is one-shot; SHA-256 cannot fail on in-memory input.
  EVP_Digest(payload.data(), payload.size(), fp.data(), &len, EVP_sha256(), nullptr);
  return fp;
}

std::string ToHex(const Fingerprint& fp) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(fp.size() * 2);
  for (uint8_t b : fp) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

std::string DownstreamKey(const Message& message, std::string_view step) {
  std::string key = message.id;
  key += ':';
  key += step;
  return key;
}

}  // namespace idem
