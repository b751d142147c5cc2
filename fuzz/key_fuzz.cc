// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The Idempotency-Key header value (http::ParseKey), bare and quoted.
// Properties: a key that parses is 1 to 255 printable ASCII characters, and
// it round-trips through QuoteKey (the header value http::Client sends); a bare token is its own key.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "idem/http/client.h"
#include "idem/http/idempotency.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto key = idem::http::ParseKey(in);
  if (!key.ok()) return 0;
  if (key->empty() || key->size() > 255) __builtin_trap();
  for (unsigned char c : *key)
    if (c < 0x20 || c > 0x7e) __builtin_trap();
  auto again = idem::http::ParseKey(idem::http::QuoteKey(*key));
  if (!again.ok() || *again != *key) __builtin_trap();
  // A bare token (no space, quote, backslash or comma) is sent as itself.
  if (key->find_first_of(" \"\\,") == std::string::npos) {
    auto bare = idem::http::ParseKey(*key);
    if (!bare.ok() || *bare != *key) __builtin_trap();
  }
  return 0;
}
