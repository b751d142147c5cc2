#include "aws/sigv4.h"

#include <idem/message.h>
#include <idem/url.h>

#include "core/hmac_sha256.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace idem::aws_internal {
namespace {

constexpr std::string_view kAlgorithm = "AWS4-HMAC-SHA256";
constexpr std::string_view kTerminator = "aws4_request";

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// Leading and trailing whitespace dropped, every inner run of whitespace one space.
std::string TrimCollapse(std::string_view v) {
  std::string out;
  bool pending_space = false;
  for (unsigned char c : v) {
    if (c == ' ' || c == '\t') {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    out += static_cast<char>(c);
  }
  return out;
}

// RFC 9110 token characters.
bool ValidHeaderName(std::string_view name) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 ||
           std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
  });
}

bool ValidHeaderValue(std::string_view v) {
  return std::none_of(v.begin(), v.end(), [](char c) { return c == '\r' || c == '\n' || c == '\0'; });
}

// A credential-scope part: non-empty, no separator, no whitespace or control bytes.
bool ValidScopePart(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(),
                     [](unsigned char c) { return c > 0x20 && c != 0x7f && c != '/' && c != ',' && c != '='; });
}

bool ValidAmzDate(std::string_view d) {
  if (d.size() != 16 || d[8] != 'T' || d[15] != 'Z') return false;
  for (size_t i = 0; i < 15; ++i) {
    if (i != 8 && std::isdigit(static_cast<unsigned char>(d[i])) == 0) return false;
  }
  return true;
}

std::string CanonicalQuery(const Fields& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [k, v] : query) encoded.emplace_back(UriEncode(k, false), UriEncode(v, false));
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [k, v] : encoded) {
    if (!out.empty()) out += '&';
    out += k;
    out += '=';
    out += v;
  }
  return out;
}

Status CheckInputs(const Request& request, const Credentials& credentials, const SignOptions& options) {
  const std::string_view where = "aws signing: ";
  if (!ValidHeaderName(request.method))
    return Status::InvalidArgument(std::string(where) + "method is empty or malformed");
  if (!ValidScopePart(options.region))
    return Status::InvalidArgument(std::string(where) + "region is empty or malformed");
  if (!ValidScopePart(options.service))
    return Status::InvalidArgument(std::string(where) + "service is empty or malformed");
  if (!ValidAmzDate(options.amz_date))
    return Status::InvalidArgument(std::string(where) + "request time '" + options.amz_date +
                                   "' is not YYYYMMDDTHHMMSSZ");
  if (!ValidScopePart(credentials.access_key_id))
    return Status::InvalidArgument(std::string(where) + "access key id is empty or malformed");
  if (credentials.secret_access_key.empty())
    return Status::InvalidArgument(std::string(where) + "secret access key is empty");
  if (!ValidHeaderValue(credentials.session_token))
    return Status::InvalidArgument(std::string(where) + "session token holds a line break or NUL byte");
  bool host = false;
  for (const auto& [name, value] : request.headers) {
    if (!ValidHeaderName(name)) return Status::InvalidArgument(std::string(where) + "malformed header name");
    std::string lower = Lower(name);
    if (!ValidHeaderValue(value))
      return Status::InvalidArgument(std::string(where) + "header " + lower + " holds a line break or NUL byte");
    if (lower == "authorization" || lower == "x-amz-date" || lower == "x-amz-security-token")
      return Status::InvalidArgument(std::string(where) + "header " + lower + " is set by the signer");
    host = host || lower == "host";
  }
  if (!host) return Status::InvalidArgument(std::string(where) + "no host header");
  return Status::OK();
}

}  // namespace

std::string UriEncode(std::string_view s, bool keep_slash) { return PercentEncode(s, keep_slash); }

std::string NormalizePath(std::string_view path) {
  std::vector<std::string_view> segments;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    std::string_view seg = path.substr(i, j - i);
    if (seg == "..") {
      if (!segments.empty()) segments.pop_back();
    } else if (!seg.empty() && seg != ".") {
      segments.push_back(seg);
    }
    i = j + 1;
  }
  std::string out;
  for (std::string_view seg : segments) {
    out += '/';
    out += seg;
  }
  // The root, or a path that ended in '/', ends in '/'.
  bool dir = !path.empty() && path.back() == '/';
  if (out.empty() || (dir && !segments.empty())) out += '/';
  return out;
}

std::string Sha256Hex(std::string_view data) { return ToHex(FingerprintOf(data)); }

std::string SigningKey(std::string_view secret, std::string_view date, std::string_view region,
                       std::string_view service) {
  std::string key = internal::HmacSha256("AWS4" + std::string(secret), date);
  key = internal::HmacSha256(key, region);
  key = internal::HmacSha256(key, service);
  return internal::HmacSha256(key, kTerminator);
}

Result<Signed> Sign(const Request& request, const Credentials& credentials, const SignOptions& options) {
  if (Status s = CheckInputs(request, credentials, options); !s.ok()) return s;

  const bool token = !credentials.session_token.empty();
  // Lowercased names, values trimmed and collapsed, repeated names joined by ','
  // in the order given; std::map sorts by name.
  std::map<std::string, std::string> canonical;
  auto add = [&canonical](std::string_view name, std::string_view value) {
    auto [it, fresh] = canonical.try_emplace(Lower(name));
    if (!fresh) it->second += ',';
    it->second += TrimCollapse(value);
  };
  for (const auto& [name, value] : request.headers) add(name, value);
  add("x-amz-date", options.amz_date);
  if (token && options.sign_session_token) add("x-amz-security-token", credentials.session_token);

  Signed out;
  std::string headers_block;
  for (const auto& [name, value] : canonical) {
    headers_block += name + ':' + value + '\n';
    if (!out.signed_headers.empty()) out.signed_headers += ';';
    out.signed_headers += name;
  }
  std::string path = options.normalize_path ? NormalizePath(request.path) : request.path;
  if (path.empty()) path = "/";
  out.canonical_request = request.method + '\n' + UriEncode(path, true) + '\n' + CanonicalQuery(request.query) + '\n' +
                          headers_block + '\n' + out.signed_headers + '\n' + Sha256Hex(request.payload);

  const std::string date = options.amz_date.substr(0, 8);
  const std::string scope = date + '/' + options.region + '/' + options.service + '/' + std::string(kTerminator);
  out.string_to_sign =
      std::string(kAlgorithm) + '\n' + options.amz_date + '\n' + scope + '\n' + Sha256Hex(out.canonical_request);
  const std::string signature = internal::LowerHex(internal::HmacSha256(
      SigningKey(credentials.secret_access_key, date, options.region, options.service), out.string_to_sign));
  out.authorization = std::string(kAlgorithm) + " Credential=" + credentials.access_key_id + '/' + scope +
                      ", SignedHeaders=" + out.signed_headers + ", Signature=" + signature;
  out.headers_to_add.emplace_back("X-Amz-Date", options.amz_date);
  if (token) out.headers_to_add.emplace_back("X-Amz-Security-Token", credentials.session_token);
  out.headers_to_add.emplace_back("Authorization", out.authorization);
  return out;
}

}  // namespace idem::aws_internal
