// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The middleware's pure parts: the stored-response format, the key grammar,
// the fingerprint and its canonical JSON, and the Request/Answer types.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <nlohmann/json.hpp>

#include "idem/http/idempotency.h"
#include "idem/http/request.h"
#include "idem/http/stored_response.h"
#include "idem/url.h"

namespace idem::http {
namespace {

void PutU32(std::string& out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutBytes(std::string& out, std::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool U32(uint32_t* v) {
    if (in_.size() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v = (*v << 8) | static_cast<unsigned char>(in_[i]);
    in_.remove_prefix(4);
    return true;
  }
  bool Bytes(std::string* s) {
    uint32_t n = 0;
    if (!U32(&n) || in_.size() < n) return false;
    s->assign(in_.substr(0, n));
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }

 private:
  std::string_view in_;
};

constexpr char kMagic[] = "idem-http-1";

}  // namespace

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

void Headers::Add(std::string name, std::string value) { fields_.emplace_back(std::move(name), std::move(value)); }

void Headers::Set(std::string_view name, std::string value) {
  Remove(name);
  fields_.emplace_back(std::string(name), std::move(value));
}

void Headers::Remove(std::string_view name) {
  std::erase_if(fields_, [&](const Field& f) { return EqualsIgnoringCase(f.first, name); });
}

const std::string* Headers::Find(std::string_view name) const {
  for (const Field& f : fields_)
    if (EqualsIgnoringCase(f.first, name)) return &f.second;
  return nullptr;
}

std::string Headers::Get(std::string_view name) const {
  const std::string* v = Find(name);
  return v != nullptr ? *v : std::string();
}

size_t Headers::Count(std::string_view name) const {
  return static_cast<size_t>(
      std::count_if(fields_.begin(), fields_.end(), [&](const Field& f) { return EqualsIgnoringCase(f.first, name); }));
}

void Answer::SetBody(std::string content, std::string_view content_type) {
  body = std::move(content);
  headers.Set("Content-Type", std::string(content_type));
}

Authenticator BearerKeys(std::map<std::string, std::string> keys) {
  return [keys = std::move(keys)](const Request& req) -> std::optional<std::string> {
    const std::string auth = req.headers.Get("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (auth.size() <= kBearer.size() || auth.compare(0, kBearer.size(), kBearer) != 0) return std::nullopt;
    auto it = keys.find(auth.substr(kBearer.size()));
    if (it == keys.end()) return std::nullopt;
    return it->second;
  };
}

std::string Encode(const StoredResponse& r) {
  std::string out(kMagic);
  PutU32(out, static_cast<uint32_t>(r.status));
  PutU32(out, static_cast<uint32_t>(r.headers.size()));
  for (const auto& [k, v] : r.headers) {
    PutBytes(out, k);
    PutBytes(out, v);
  }
  PutBytes(out, r.body);
  return out;
}

Result<StoredResponse> Decode(std::string_view bytes) {
  const size_t magic = std::strlen(kMagic);
  if (bytes.substr(0, magic) != kMagic) return Status::Corruption("stored response is not idem's HTTP format");
  Reader in(bytes.substr(magic));
  StoredResponse r;
  uint32_t status = 0, n = 0;
  if (!in.U32(&status) || !in.U32(&n)) return Status::Corruption("stored response truncated");
  r.status = static_cast<int>(status);
  for (uint32_t i = 0; i < n; ++i) {
    std::string k, v;
    if (!in.Bytes(&k) || !in.Bytes(&v)) return Status::Corruption("stored response header truncated");
    r.headers.emplace_back(std::move(k), std::move(v));
  }
  if (!in.Bytes(&r.body) || !in.done()) return Status::Corruption("stored response body truncated");
  return r;
}

Result<std::string> ParseKey(std::string_view v) {
  // Optional whitespace around the item is allowed by HTTP field parsing.
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (v.empty()) return Status::InvalidArgument("Idempotency-Key is empty");
  std::string key;
  if (v.front() != '"') {
    // A bare token, as Stripe's client libraries send a key: the same key as
    // its quoted form. A comma would make it a list, a quote or backslash
    // would read differently quoted.
    for (unsigned char c : v) {
      if (c == ' ' || c == '\t')
        return Status::InvalidArgument("Idempotency-Key: a key with spaces must be a quoted string (\"...\")");
      if (c < 0x21 || c > 0x7e)
        return Status::InvalidArgument("Idempotency-Key: only printable ASCII characters are allowed");
      if (c == ',') return Status::InvalidArgument("Idempotency-Key: send one key, not a list");
      if (c == '"' || c == '\\')
        return Status::InvalidArgument(
            "Idempotency-Key: an unquoted key cannot hold \" or \\ (send it as a quoted string with them escaped)");
    }
    key = std::string(v);
  } else {
    if (v.size() < 2 || v.back() != '"')
      return Status::InvalidArgument("Idempotency-Key: the quoted string has no closing quote");
    for (size_t i = 1; i + 1 < v.size(); ++i) {
      unsigned char c = static_cast<unsigned char>(v[i]);
      if (c == '\\') {
        if (i + 2 >= v.size() || (v[i + 1] != '"' && v[i + 1] != '\\'))
          return Status::InvalidArgument("Idempotency-Key: a backslash may only escape \" or \\");
        key += v[++i];
        continue;
      }
      if (c == '"') return Status::InvalidArgument("Idempotency-Key: an unescaped quote inside the string");
      if (c < 0x20 || c > 0x7e)
        return Status::InvalidArgument("Idempotency-Key: only printable ASCII characters are allowed");
      key += static_cast<char>(c);
    }
  }
  if (key.empty()) return Status::InvalidArgument("Idempotency-Key is empty");
  if (key.size() > 255)
    return Status::InvalidArgument("Idempotency-Key is " + std::to_string(key.size()) + " characters; at most 255");
  return key;
}

// Whether JSON text nests arrays and objects at most `max` deep (strings
// skipped). A deeper body is not canonicalised: dump() recurses once per
// level, and 100,000 levels in a 200 KB body would overflow the stack.
bool NestsAtMost(std::string_view body, int max) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

std::optional<std::string> CanonicalJson(std::string_view body) {
  // Deeper than any request a route means: fingerprinted as bytes instead.
  if (!NestsAtMost(body, 128)) return std::nullopt;
  // nlohmann::json keeps objects in a std::map: dump() writes keys sorted,
  // without whitespace.
  nlohmann::json j = nlohmann::json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j.dump();
}

Result<std::vector<std::pair<std::string, std::string>>> ParseForm(std::string_view body) {
  std::vector<std::pair<std::string, std::string>> pairs;
  auto decode = [](std::string_view part) {
    std::string plus(part);
    std::replace(plus.begin(), plus.end(), '+', ' ');
    return PercentDecode(plus);
  };
  while (!body.empty()) {
    const size_t amp = body.find('&');
    const std::string_view pair = body.substr(0, amp);
    body = amp == std::string_view::npos ? std::string_view() : body.substr(amp + 1);
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    auto name = decode(pair.substr(0, eq));
    auto value = decode(eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1));
    if (!name.ok() || !value.ok())
      return Status::InvalidArgument("the form pair '" + Printable(pair, 64) +
                                     "': " + (name.ok() ? value : name).status().message());
    pairs.emplace_back(std::move(*name), std::move(*value));
  }
  return pairs;
}

std::optional<std::string> CanonicalForm(std::string_view body) {
  auto pairs = ParseForm(body);
  if (!pairs.ok()) return std::nullopt;
  std::stable_sort(pairs->begin(), pairs->end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& [name, value] : *pairs) {
    if (!out.empty()) out += '&';
    out += PercentEncode(name);
    out += '=';
    out += PercentEncode(value);
  }
  return out;
}

Fingerprint RequestFingerprint(std::string_view method, std::string_view route, std::string_view body,
                               std::string_view content_type) {
  std::string material(method);
  material += '\0';
  material += route;
  material += '\0';
  // The media type, without parameters (charset=...), any case.
  std::string_view media = content_type.substr(0, content_type.find(';'));
  while (!media.empty() && (media.back() == ' ' || media.back() == '\t')) media.remove_suffix(1);
  std::optional<std::string> form;
  if (EqualsIgnoringCase(media, "application/x-www-form-urlencoded")) form = CanonicalForm(body);
  if (form) {
    material += "form:";
    material += *form;
  } else if (auto canonical = CanonicalJson(body)) {
    material += "json:";
    material += *canonical;
  } else {
    material += "raw:";
    material += body;
  }
  return FingerprintOf(material);
}

}  // namespace idem::http
