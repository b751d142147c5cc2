// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The embedded queue's rows as Receive reads them (src/embedded/rows.h): any
// values in any column, as a damaged or foreign queue file may hold.
// Input: per column (seq, id, producer_time_ms, payload, headers,
// deliveries) a kind byte (0 NULL, 1 integer, 2 real: 8 bytes little-endian
// follow; 3 text, 4 blob: a 2-byte little-endian length and the bytes
// follow); the rest is the lease token.
// Properties: headers that decode encode back to the same bytes; a decoded
// row's receipt is its seq, ':', the token.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "embedded/rows.h"

namespace {

bool Take(std::string_view& in, size_t n, std::string_view& out) {
  if (in.size() < n) return false;
  out = in.substr(0, n);
  in.remove_prefix(n);
  return true;
}

bool Column(std::string_view& in, idem::Value& v) {
  std::string_view kind, bytes;
  if (!Take(in, 1, kind)) return false;
  switch (kind[0] % 5) {
    case 0: v = idem::Value(); return true;
    case 1:
    case 2: {
      if (!Take(in, 8, bytes)) return false;
      uint64_t u = 0;
      for (int i = 7; i >= 0; --i) u = (u << 8) | static_cast<unsigned char>(bytes[i]);
      if (kind[0] % 5 == 1) {
        v = idem::Value(static_cast<int64_t>(u));
      } else {
        double d = 0;
        std::memcpy(&d, &u, sizeof d);
        v = idem::Value(d);
      }
      return true;
    }
    default: {
      std::string_view len;
      if (!Take(in, 2, len)) return false;
      const size_t n = static_cast<unsigned char>(len[0]) | static_cast<size_t>(static_cast<unsigned char>(len[1]))
                                                                << 8;
      if (!Take(in, std::min(n, in.size()), bytes)) return false;
      if (kind[0] % 5 == 3)
        v = idem::Value(std::string(bytes));
      else
        v = idem::Value(idem::Blob{std::string(bytes)});
      return true;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<idem::Value> row(6);
  for (idem::Value& v : row)
    if (!Column(in, v)) return 0;
  const std::string token(in);
  auto d = idem::embedded_internal::DecodeRow(row, token);
  if (d.ok() && d->receipt != std::to_string(row[0].AsInt()) + ":" + token) __builtin_trap();
  const std::string blob = row[4].AsText();
  auto headers = idem::embedded_internal::DecodeHeaders(blob);
  if (headers.ok() && idem::embedded_internal::EncodeHeaders(*headers) != blob) __builtin_trap();
  return 0;
}
