// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the one parser for idem's own URLs ("sqlite:PATH?k=v",
// "embedded:PATH?k=v").
#ifndef IDEM_SRC_CORE_URL_H_
#define IDEM_SRC_CORE_URL_H_

#include <cctype>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/result.h"

namespace idem::url_internal {

struct Url {
  std::string path;
  std::vector<std::pair<std::string, std::string>> options;  // in order; a key without '=' has ""
};

// Strips the first matching scheme prefix (longest first: "sqlite://",
// "sqlite:"; errors show the last), splits
// the path from "?k=v&k2=v2". With `bare_ok`, a string without any of the
// prefixes (and without "://") is a bare path. Errors name the URL.
inline Result<Url> Parse(std::string_view url, std::initializer_list<std::string_view> prefixes, bool bare_ok,
                         std::string_view what) {
  std::string_view rest = url;
  bool matched = false;
  for (std::string_view p : prefixes) {
    if (rest.starts_with(p)) {
      rest.remove_prefix(p.size());
      matched = true;
      break;
    }
  }
  // A bare path is accepted where allowed, unless it starts like another
  // URL ("scheme:" or "scheme://"): a mistyped URL would otherwise become a
  // file of that name.
  const size_t colon = rest.find(':');
  const bool looks_like_url =
      colon != std::string_view::npos && colon > 0 && std::isalpha(static_cast<unsigned char>(rest[0])) &&
      rest.substr(0, colon).find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-") ==
          std::string_view::npos;
  if (!matched && (!bare_ok || looks_like_url))
    return Status::InvalidArgument("not " + std::string(what) + " URL: '" + std::string(url) + "' (expected " +
                                   std::string(*(prefixes.end() - 1)) + "PATH)");
  Url out;
  std::string_view query;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (rest.empty()) return Status::InvalidArgument(std::string(what) + " URL has no path: '" + std::string(url) + "'");
  out.path = std::string(rest);
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    auto eq = kv.find('=');
    out.options.emplace_back(std::string(kv.substr(0, eq)),
                             std::string(eq == std::string_view::npos ? std::string_view() : kv.substr(eq + 1)));
  }
  return out;
}

}  // namespace idem::url_internal

#endif  // IDEM_SRC_CORE_URL_H_
