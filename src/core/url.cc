// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/url.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <system_error>

namespace idem {
namespace {

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsSchemeChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.'; }

// Where the scheme ends (the ':'), or npos when `url` has none.
size_t SchemeEnd(std::string_view url) {
  size_t colon = url.find(':');
  if (colon == std::string_view::npos || colon == 0 || !std::isalpha(static_cast<unsigned char>(url[0])))
    return std::string_view::npos;
  for (size_t i = 0; i < colon; ++i)
    if (!IsSchemeChar(url[i])) return std::string_view::npos;
  return colon;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// Schemes whose lone userinfo ("scheme://SECRET@host") is a password.
bool LoneUserinfoIsPassword(std::string_view scheme) { return scheme == "redis" || scheme == "rediss"; }

void RedactPasswordKeys(std::string& out) {
  // password=... in a query (?password=, &password=) or a key=value string
  // (password=... or password = '...').
  for (size_t at = out.find("password"); at != std::string::npos; at = out.find("password", at + 1)) {
    if (at > 0 && (std::isalnum(static_cast<unsigned char>(out[at - 1])) || out[at - 1] == '_')) continue;
    size_t v = at + 8;
    while (v < out.size() && out[v] == ' ') ++v;
    if (v >= out.size() || out[v] != '=') continue;
    ++v;
    while (v < out.size() && out[v] == ' ') ++v;
    size_t end = v;
    if (end < out.size() && out[end] == '\'') {
      // A quoted value ends at its closing quote (libpq: \' and \\ are
      // escapes inside), and whatever is glued to it goes too, so that the
      // result redacts to itself.
      for (++end; end < out.size() && out[end] != '\''; ++end)
        if (out[end] == '\\' && end + 1 < out.size()) ++end;
      if (end < out.size()) ++end;
    }
    while (end < out.size() && out[end] != '&' && out[end] != ' ') ++end;
    out.replace(v, end - v, "***");
  }
}

Status Invalid(std::string_view what, std::string_view url, std::string_view why) {
  return Status::InvalidArgument("bad " + std::string(what) + " '" + RedactUrl(url) + "': " + std::string(why));
}

bool ParsePort(std::string_view s, int& out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string_view::npos) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && out >= 1 && out <= 65535;
}

Status ParseHost(std::string_view hp, std::string_view what, std::string_view url, ParsedUrl::Host& h) {
  std::string_view after;  // "" or ":PORT"
  if (hp.starts_with('[')) {
    size_t close = hp.find(']');
    if (close == std::string_view::npos) return Invalid(what, url, "'[' without ']' around an IPv6 address");
    h.host = std::string(hp.substr(1, close - 1));
    after = hp.substr(close + 1);
    if (!after.empty() && !after.starts_with(':')) return Invalid(what, url, "junk after ']'");
  } else {
    size_t colon = hp.find(':');
    h.host = std::string(hp.substr(0, colon));
    if (colon != std::string_view::npos) after = hp.substr(colon);
  }
  if (h.host.empty()) return Invalid(what, url, "no host");
  if (after.empty()) return Status::OK();
  if (!ParsePort(after.substr(1), h.port)) return Invalid(what, url, "the port is not 1..65535");
  return Status::OK();
}

}  // namespace

std::string PercentEncode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string FormatUrl(const ParsedUrl& u) {
  std::string out = u.scheme + ":";
  if (u.has_authority) out += "//";
  std::string path = PercentEncode(u.path, /*keep_slash=*/true);
  if (u.hosts.empty()) {
    // The file form: a PATH that starts with "//" would read as an authority.
    if (!u.has_authority && path.starts_with("//")) path.replace(0, 1, "%2F");
  } else {
    if (u.has_user) {
      out += PercentEncode(u.user, false);
      if (u.has_password) out += ":" + PercentEncode(u.password, false);
      out += "@";
    }
    for (size_t i = 0; i < u.hosts.size(); ++i) {
      const ParsedUrl::Host& h = u.hosts[i];
      if (i > 0) out += ",";
      const bool bracket = h.host.find(':') != std::string::npos || h.host.starts_with('[');
      out += bracket ? "[" + h.host + "]" : h.host;
      if (h.port != 0) out += ":" + std::to_string(h.port);
    }
  }
  out += path;
  for (size_t i = 0; i < u.query.size(); ++i)
    out += (i == 0 ? "?" : "&") + u.query[i].first + "=" + PercentEncode(u.query[i].second, false);
  return out;
}

std::string UrlScheme(std::string_view url) {
  size_t end = SchemeEnd(url);
  return end == std::string_view::npos ? std::string() : Lower(url.substr(0, end));
}

namespace {

// One pass of RedactUrl.
std::string RedactOnce(std::string_view url) {
  std::string out(url);
  if (size_t scheme = out.find("://"); scheme != std::string::npos) {
    size_t auth_end = out.find_first_of("/?#", scheme + 3);
    if (auth_end == std::string::npos) auth_end = out.size();
    size_t at = out.rfind('@', auth_end == 0 ? 0 : auth_end - 1);
    if (at != std::string::npos && at > scheme + 2 && at < auth_end) {
      size_t colon = out.find(':', scheme + 3);
      if (colon != std::string::npos && colon < at) {
        out.replace(colon + 1, at - colon - 1, "***");
      } else if (LoneUserinfoIsPassword(Lower(std::string_view(out).substr(0, scheme)))) {
        out.replace(scheme + 3, at - scheme - 3, "***");
      }
    }
  }
  RedactPasswordKeys(out);
  return out;
}

}  // namespace

std::string RedactUrl(std::string_view url) {
  // Hiding a value can move where the authority ends (a '#' or '/' inside a
  // password value): passes run until one changes nothing, so that the
  // result redacts to itself. Each pass only turns text into "***"; a URL
  // needs one or two.
  std::string out = RedactOnce(url);
  for (int pass = 0; pass < 16; ++pass) {
    std::string next = RedactOnce(out);
    if (next == out) break;
    out = std::move(next);
  }
  return out;
}

Result<std::string> PercentDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) return Status::InvalidArgument("a '%' escape is cut short");
    int hi = Hex(s[i + 1]), lo = Hex(s[i + 2]);
    if (hi < 0 || lo < 0) return Status::InvalidArgument("a '%' escape is not two hex digits");
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

std::string ParsedUrl::Get(std::string_view key, std::string_view fallback) const {
  for (const auto& [k, v] : query)
    if (k == key) return v;
  return std::string(fallback);
}

bool ParsedUrl::Has(std::string_view key) const {
  return std::any_of(query.begin(), query.end(), [&](const auto& kv) { return kv.first == key; });
}

Status ParsedUrl::CheckKeys(std::initializer_list<std::string_view> known) const {
  for (size_t i = 0; i < query.size(); ++i) {
    const std::string& k = query[i].first;
    for (size_t j = 0; j < i; ++j)
      if (query[j].first == k) return Status::InvalidArgument("'" + k + "' is given twice in '" + RedactUrl(url) + "'");
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      std::string list;
      for (std::string_view n : known) list += (list.empty() ? "" : ", ") + std::string(n);
      return Status::InvalidArgument("unknown parameter '" + k + "' in '" + RedactUrl(url) +
                                     "' (known: " + (list.empty() ? "none" : list) + ")");
    }
  }
  return Status::OK();
}

Result<int64_t> ParsedUrl::GetInt(std::string_view key, int64_t fallback, int64_t min, int64_t max) const {
  if (!Has(key)) return fallback;
  const std::string v = Get(key);
  int64_t n = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || ec != std::errc() || p != v.data() + v.size() || n < min || n > max)
    return Status::InvalidArgument(std::string(key) + " must be an integer from " + std::to_string(min) + " to " +
                                   std::to_string(max) + ", got '" + v.substr(0, 40) + "' in '" + RedactUrl(url) + "'");
  return n;
}

Result<bool> ParsedUrl::GetBool(std::string_view key, bool fallback) const {
  if (!Has(key)) return fallback;
  const std::string v = Lower(Get(key));
  if (v == "true" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "no") return false;
  return Status::InvalidArgument(std::string(key) + " must be true or false, got '" + v.substr(0, 40) + "' in '" +
                                 RedactUrl(url) + "'");
}

Result<ParsedUrl> ParseUrl(std::string_view url, std::string_view what, UrlForm form) {
  ParsedUrl out;
  out.url = std::string(url);
  const size_t colon = SchemeEnd(url);
  if (colon == std::string_view::npos) return Invalid(what, url, "no scheme (expected SCHEME:...)");
  out.scheme = Lower(url.substr(0, colon));
  std::string_view rest = url.substr(colon + 1);
  std::string_view query;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (rest.starts_with("//")) {
    out.has_authority = true;
    rest.remove_prefix(2);
  }
  if (form == UrlForm::kFile) {
    IDEM_ASSIGN_OR_RETURN(out.path, PercentDecode(rest));
  } else {
    if (!out.has_authority) return Invalid(what, url, "expected " + out.scheme + "://HOST");
    size_t slash = rest.find('/');
    std::string_view authority = rest.substr(0, slash);
    if (slash != std::string_view::npos) {
      IDEM_ASSIGN_OR_RETURN(out.path, PercentDecode(rest.substr(slash)));
    }
    if (size_t at = authority.rfind('@'); at != std::string_view::npos) {
      std::string_view info = authority.substr(0, at);
      authority = authority.substr(at + 1);
      out.has_user = true;
      size_t c = info.find(':');
      auto user = PercentDecode(info.substr(0, c));
      if (!user.ok()) return Invalid(what, url, user.status().message());
      out.user = *user;
      if (c != std::string_view::npos) {
        out.has_password = true;
        auto pw = PercentDecode(info.substr(c + 1));
        if (!pw.ok()) return Invalid(what, url, pw.status().message());
        out.password = *pw;
      }
    }
    while (true) {
      size_t comma = authority.find(',');
      ParsedUrl::Host h;
      IDEM_RETURN_IF_ERROR(ParseHost(authority.substr(0, comma), what, url, h));
      out.hosts.push_back(std::move(h));
      if (comma == std::string_view::npos) break;
      authority = authority.substr(comma + 1);
    }
  }
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (kv.empty()) continue;
    size_t eq = kv.find('=');
    auto value = PercentDecode(eq == std::string_view::npos ? std::string_view() : kv.substr(eq + 1));
    if (!value.ok()) return Invalid(what, url, value.status().message());
    out.query.emplace_back(std::string(kv.substr(0, eq)), *value);
  }
  return out;
}

}  // namespace idem
