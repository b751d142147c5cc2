// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The one JSON string escaper: idem::JsonLog's lines and the CLI's --json.
#ifndef IDEM_SRC_CORE_JSON_STRING_H_
#define IDEM_SRC_CORE_JSON_STRING_H_

#include <cstdio>
#include <string>
#include <string_view>

namespace idem::internal {

// The length of the valid UTF-8 sequence starting at s[i], 0 if none.
inline size_t Utf8Length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xc0) == 0x80; };
  const unsigned char c = b(0);
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    if (!cont(1) || !cont(2)) return 0;
    if ((c == 0xe0 && b(1) < 0xa0) || (c == 0xed && b(1) > 0x9f)) return 0;
    return 3;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if ((c == 0xf0 && b(1) < 0x90) || (c == 0xf4 && b(1) > 0x8f)) return 0;
    return 4;
  }
  return 0;
}

// Always valid JSON: a byte that is not part of valid UTF-8 (an id may hold
// any bytes) becomes U+FFFD.
inline std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = Utf8Length(s, i);
      if (n == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  return out + "\"";
}

}  // namespace idem::internal

#endif  // IDEM_SRC_CORE_JSON_STRING_H_
