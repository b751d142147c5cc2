// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// URLs as idem reads them: the one grammar every adapter's ParseUrl uses,
// and the one place passwords are hidden before a URL is printed.
//
//   scheme:PATH[?k=v&...]                                   file adapters (sqlite:, embedded:)
//   scheme://[USER[:PASSWORD]@]HOST[:PORT][,HOST[:PORT]...][/PATH][?k=v&...]
//
// USER, PASSWORD, PATH and every query value may hold %XX escapes (write
// '@' as %40, ':' as %3A, '/' as %2F). Query keys are plain. A key given
// twice is an error; a key an adapter does not know is an error naming it.
// doc/adapters.md lists every scheme and its keys.
//
// Thread safety: pure functions.
#ifndef IDEM_URL_H_
#define IDEM_URL_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/result.h"

namespace idem {

// `url` with every password replaced by "***": the PASSWORD of
// USER:PASSWORD@; a lone userinfo where the scheme could mean a password by
// it (redis://SECRET@host, which the Redis adapter refuses but never
// prints); and the value of any password=... key, in a query or in a libpq
// "key=value" string. Everything else is kept, so the result still says
// which server was meant. Idempotent.
std::string RedactUrl(std::string_view url);

// Decodes %XX escapes. kInvalidArgument for a '%' not followed by two hex
// digits.
Result<std::string> PercentDecode(std::string_view text);
// %XX (upper-case hex) for every byte but the unreserved ones (letters,
// digits, - . _ ~), and '/' when `keep_slash`.
std::string PercentEncode(std::string_view text, bool keep_slash = false);

// A URL split into its parts, %XX escapes decoded.
struct ParsedUrl {
  struct Host {
    std::string host{};  // an IPv6 address without its brackets
    int port = 0;        // 0: not given
  };
  std::string scheme{};        // lower case, without ':' or "://"
  bool has_authority = false;  // "scheme://" rather than "scheme:"
  bool has_user = false;
  bool has_password = false;  // "USER:" was followed by a password (maybe empty)
  std::string user{};
  std::string password{};
  std::vector<Host> hosts{};                                 // empty for scheme:PATH
  std::string path{};                                        // after the authority's '/', or after "scheme:"
  std::vector<std::pair<std::string, std::string>> query{};  // in order; "k" alone gives ""

  // The value of query key `key`, or `fallback`.
  std::string Get(std::string_view key, std::string_view fallback = {}) const;
  bool Has(std::string_view key) const;
  // kInvalidArgument naming the first query key not in `known` (and listing
  // `known`), or a key given twice.
  Status CheckKeys(std::initializer_list<std::string_view> known) const;
  // The query value `key` as an integer in [min, max]; `fallback` when
  // absent. Digits only (no sign, units or spaces); errors name the key,
  // the bounds and the URL (redacted).
  Result<int64_t> GetInt(std::string_view key, int64_t fallback, int64_t min, int64_t max) const;
  // "true"/"1"/"yes" or "false"/"0"/"no"; `fallback` when absent.
  Result<bool> GetBool(std::string_view key, bool fallback) const;

  std::string url{};  // the original, for errors (print RedactUrl(url))
};

enum class UrlForm {
  kNetwork,  // scheme://[USER[:PASSWORD]@]HOST[:PORT][,...][/PATH][?query]
  kFile,     // scheme:PATH or scheme://PATH (PATH taken as written, no host)
};

// Splits `url` by the grammar above. `what` names the kind of URL for
// errors ("Redis URL" gives "bad Redis URL '...': ..."). Errors are kInvalidArgument and show the URL with
// its password hidden. In the network form `path` keeps its leading '/'
// ("redis://h/2" gives "/2").
Result<ParsedUrl> ParseUrl(std::string_view url, std::string_view what = "URL", UrlForm form = UrlForm::kNetwork);

// `url` printed back by the grammar above: a URL that ParseUrl (in the form
// `url` was parsed in: kFile when it has no hosts) splits into the same
// fields. USER, PASSWORD, PATH and query values are %XX-escaped where a
// character would read differently (every byte but letters, digits and
// "-._~", and '/' inside PATH); hosts and query keys are written as parsed
// (ParseUrl never decodes them), an IPv6 host in brackets. The password is
// printed: give the result to RedactUrl before showing it.
std::string FormatUrl(const ParsedUrl& url);

// The scheme of `url` in lower case ("" when it has none).
std::string UrlScheme(std::string_view url);

}  // namespace idem

#endif  // IDEM_URL_H_
