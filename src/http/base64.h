// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: standard base64 (RFC 4648, with padding) over OpenSSL's
// EVP_EncodeBlock / EVP_DecodeBlock: webhook signatures and secrets
// (src/http/webhook.cc), Pub/Sub message data (src/pubsub), SQS binary
// attributes and bodies (src/sqs).
#ifndef IDEM_SRC_HTTP_BASE64_H_
#define IDEM_SRC_HTTP_BASE64_H_

#include <openssl/evp.h>

#include <optional>
#include <string>
#include <string_view>

namespace idem::http_internal {

// std::nullopt for an empty input or one that is not padded base64.
inline std::optional<std::string> Base64Decode(std::string_view in) {
  // EVP_DecodeBlock wants a multiple of 4 and counts padding as zeros.
  if (in.empty() || in.size() % 4 != 0) return std::nullopt;
  std::string out(in.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  if (n < 0) return std::nullopt;
  size_t pad = (in.back() == '=') + (in.size() > 1 && in[in.size() - 2] == '=');
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

inline std::string Base64Encode(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace idem::http_internal

#endif  // IDEM_SRC_HTTP_BASE64_H_
