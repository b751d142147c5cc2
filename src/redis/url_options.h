// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: what redis::ClaimStore and redis::Prefilter share in their
// ParseUrl and Open (the query keys of a redis:// URL, the connection
// fields' checks).
#ifndef IDEM_SRC_REDIS_URL_OPTIONS_H_
#define IDEM_SRC_REDIS_URL_OPTIONS_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include "core/options_check.h"
#include "idem/result.h"
#include "idem/status.h"
#include "idem/url.h"
#include "redis/client.h"

namespace idem::redis_internal {

// A redis:// URL read by idem/url.h's grammar: `base` is the URL without its
// query (what the connection code reads), `parsed` has the query, checked
// against `known`.
struct UrlWithOptions {
  std::string base;
  ParsedUrl parsed;
};

inline Result<UrlWithOptions> ParseUrlWithOptions(std::string_view url, std::initializer_list<std::string_view> known) {
  if (UrlScheme(url) != "redis")
    return Status::InvalidArgument("not a Redis URL: '" + RedactUrl(url) +
                                   "' (expected redis://[[USER]:PASSWORD@]HOST[:PORT][/DB])");
  UrlWithOptions out;
  IDEM_ASSIGN_OR_RETURN(out.parsed, ParseUrl(url, "Redis URL", UrlForm::kNetwork));
  IDEM_RETURN_IF_ERROR(out.parsed.CheckKeys(known));
  out.base = std::string(url.substr(0, url.find('?')));
  // The endpoint itself (user, password, host, database) is checked as Open does.
  IDEM_RETURN_IF_ERROR(redis_internal::ParseUrl(out.base).status());
  return out;
}

// An integer key into an int field.
inline Status GetIntInto(const ParsedUrl& u, std::string_view key, int64_t min, int64_t max, int& field) {
  IDEM_ASSIGN_OR_RETURN(int64_t v, u.GetInt(key, field, min, max));
  field = static_cast<int>(v);
  return Status::OK();
}

// The connection fields every Redis adapter has, checked at Open.
inline Status CheckConnectFields(std::string_view what, int pool_size, int64_t connect_timeout_ms,
                                 int64_t command_timeout_ms, std::string_view client_name) {
  using options_internal::AtLeast;
  IDEM_RETURN_IF_ERROR(AtLeast(what, "pool_size", pool_size, 1));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "connect_timeout_ms", connect_timeout_ms, 1));
  IDEM_RETURN_IF_ERROR(AtLeast(what, "command_timeout_ms", command_timeout_ms, 1));
  return ValidateClientName(client_name);
}

constexpr int64_t kMaxIntField = std::numeric_limits<int>::max();

}  // namespace idem::redis_internal

#endif  // IDEM_SRC_REDIS_URL_OPTIONS_H_
