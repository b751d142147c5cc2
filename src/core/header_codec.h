// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: headers as one byte string, for a database column that relays
// on other machines read: for each pair, the name's length (u32, little
// endian), the name, the value's length, the value. Fixed byte order, so a
// row written on one machine reads the same on any other.
#ifndef IDEM_SRC_CORE_HEADER_CODEC_H_
#define IDEM_SRC_CORE_HEADER_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::internal {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

inline void PutU32(std::string& out, size_t n) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
}

inline std::string EncodeHeaders(const HeaderList& headers) {
  std::string out;
  for (const auto& [k, v] : headers) {
    PutU32(out, k.size());
    out += k;
    PutU32(out, v.size());
    out += v;
  }
  return out;
}

// std::nullopt when `bytes` is not what EncodeHeaders writes.
inline std::optional<HeaderList> DecodeHeaders(std::string_view bytes) {
  HeaderList out;
  auto take = [&](std::string& into) {
    if (bytes.size() < 4) return false;
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    bytes.remove_prefix(4);
    if (bytes.size() < n) return false;
    into.assign(bytes.substr(0, n));
    bytes.remove_prefix(n);
    return true;
  };
  while (!bytes.empty()) {
    std::pair<std::string, std::string> h;
    if (!take(h.first) || !take(h.second)) return std::nullopt;
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace idem::internal

#endif  // IDEM_SRC_CORE_HEADER_CODEC_H_
