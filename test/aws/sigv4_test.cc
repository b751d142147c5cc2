// The AWS Signature Version 4 signer against AWS's published test suite
// (sigv4_testsuite/, SOURCE.md): for every case, the canonical request, the
// string to sign and the Authorization header must equal the published files
// byte for byte. Then the signer's refusals.
#include "aws/sigv4.h"
#include "core/hmac_sha256.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace idem::aws_internal {
namespace {

namespace fs = std::filesystem;

constexpr const char* kKeyId = "AKIDEXAMPLE";
constexpr const char* kSecret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
constexpr const char* kDate = "20150830T123600Z";

// Every case of the suite; SuiteHoldsExactlyTheseCases keeps the list whole.
const std::vector<std::string> kCases = {
    "get-header-key-duplicate",
    "get-header-value-multiline",
    "get-header-value-order",
    "get-header-value-trim",
    "get-unreserved",
    "get-utf8",
    "get-vanilla",
    "get-vanilla-empty-query-key",
    "get-vanilla-query",
    "get-vanilla-query-order-encoded",
    "get-vanilla-query-order-key",
    "get-vanilla-query-order-key-case",
    "get-vanilla-query-order-value",
    "get-vanilla-query-unreserved",
    "get-vanilla-utf8-query",
    "get-vanilla-with-session-token",
    "normalize-path/get-relative",
    "normalize-path/get-relative-relative",
    "normalize-path/get-slash",
    "normalize-path/get-slash-dot-slash",
    "normalize-path/get-slash-pointless-dot",
    "normalize-path/get-slashes",
    "normalize-path/get-space",
    "normalize-path/get-special-character",
    "post-header-key-case",
    "post-header-key-sort",
    "post-header-value-case",
    "post-sts-token/post-sts-header-after",
    "post-sts-token/post-sts-header-before",
    "post-vanilla",
    "post-vanilla-empty-query-value",
    "post-vanilla-query",
    "post-x-www-form-urlencoded",
    "post-x-www-form-urlencoded-parameters",
};

// The token the suite's readme gives for post-sts-token, and the one
// get-vanilla-with-session-token's .creq signs.
constexpr const char* kStsToken =
    "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8Y"
    "UuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE"
    "8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2"
    "ICCR/oLxBA==";
constexpr const char* kVanillaToken = "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267";

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// One .req file: the request line, headers (a line that starts with
// whitespace continues the previous header's value), a blank line, the body.
struct RawRequest {
  Request request;
  std::string body;
  std::string amz_date;
  std::string token;  // X-Amz-Security-Token, when the .req carries it
};

RawRequest ParseReq(const std::string& text) {
  RawRequest raw;
  size_t eol = text.find('\n');
  std::string line = text.substr(0, eol);
  size_t sp = line.find(' ');
  size_t ver = line.rfind(" HTTP/");
  raw.request.method = line.substr(0, sp);
  std::string target = line.substr(sp + 1, ver - sp - 1);
  size_t q = target.find('?');
  raw.request.path = PercentDecode(target.substr(0, q));
  if (q != std::string::npos) {
    std::string_view query = std::string_view(target).substr(q + 1);
    while (!query.empty()) {
      size_t amp = query.find('&');
      std::string_view pair = query.substr(0, amp);
      size_t eq = pair.find('=');
      raw.request.query.emplace_back(PercentDecode(pair.substr(0, eq)),
                                     eq == std::string_view::npos ? "" : PercentDecode(pair.substr(eq + 1)));
      query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    }
  }
  size_t pos = eol == std::string::npos ? text.size() : eol + 1;
  Fields headers;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string l = text.substr(pos, end - pos);
    pos = end + 1;
    if (l.empty()) {
      raw.body = pos < text.size() ? text.substr(pos) : "";
      break;
    }
    if (l[0] == ' ' || l[0] == '\t') {
      headers.back().second += l;
      continue;
    }
    size_t colon = l.find(':');
    headers.emplace_back(l.substr(0, colon), l.substr(colon + 1));
  }
  for (auto& [name, value] : headers) {
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower == "x-amz-date") {
      raw.amz_date = value;
    } else if (lower == "x-amz-security-token") {
      raw.token = value;
    } else {
      raw.request.headers.emplace_back(name, value);
    }
  }
  return raw;
}

class Sigv4Suite : public ::testing::TestWithParam<std::string> {};

TEST_P(Sigv4Suite, MatchesPublishedVectors) {
  const fs::path dir = fs::path(IDEM_SIGV4_SUITE) / GetParam();
  const std::string base = (dir / dir.filename()).string();
  const std::string req = ReadFile(base + ".req");
  ASSERT_FALSE(req.empty()) << base << ".req";
  RawRequest raw = ParseReq(req);
  raw.request.payload = raw.body;
  ASSERT_EQ(raw.amz_date, kDate);

  Credentials creds{kKeyId, kSecret, raw.token};
  SignOptions opts{.region = "us-east-1", .service = "service", .amz_date = kDate};
  if (GetParam() == "get-vanilla-with-session-token") creds.session_token = kVanillaToken;
  if (GetParam() == "post-sts-token/post-sts-header-after") {
    creds.session_token = kStsToken;
    opts.sign_session_token = false;
  }
  if (GetParam() == "post-sts-token/post-sts-header-before") {
    ASSERT_EQ(creds.session_token, kStsToken);
  }

  Result<Signed> s = Sign(raw.request, creds, opts);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->canonical_request, ReadFile(base + ".creq"));
  EXPECT_EQ(s->string_to_sign, ReadFile(base + ".sts"));
  EXPECT_EQ(s->authorization, ReadFile(base + ".authz"));

  // What the request is sent with: the date, the token (signed or not), the signature.
  Fields expect_add = {{"X-Amz-Date", kDate}};
  if (!creds.session_token.empty()) expect_add.emplace_back("X-Amz-Security-Token", creds.session_token);
  expect_add.emplace_back("Authorization", s->authorization);
  EXPECT_EQ(s->headers_to_add, expect_add);
}

INSTANTIATE_TEST_SUITE_P(Published, Sigv4Suite, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace_if(
                               name.begin(), name.end(), [](char c) { return c == '-' || c == '/'; }, '_');
                           return name;
                         });

TEST(Sigv4, SuiteHoldsExactlyTheseCases) {
  std::vector<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(IDEM_SIGV4_SUITE)) {
    if (e.path().extension() == ".req")
      found.push_back(fs::relative(e.path().parent_path(), IDEM_SIGV4_SUITE).generic_string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> listed = kCases;
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(found, listed);
}

// AWS's documented example of the derived key ("Examples of how to derive a
// signing key for Signature Version 4").
TEST(Sigv4, SigningKeyMatchesDocumentedExample) {
  std::string key = SigningKey(kSecret, "20120215", "us-east-1", "iam");
  std::string hex = internal::LowerHex(key);
  EXPECT_EQ(hex, "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");
}

TEST(Sigv4, UriEncodeKeepsOnlyUnreserved) {
  EXPECT_EQ(UriEncode("a-b_c.d~e/f g+h=ሴ", false), "a-b_c.d~e%2Ff%20g%2Bh%3D%E1%88%B4");
  EXPECT_EQ(UriEncode("/a b/", true), "/a%20b/");
}

TEST(Sigv4, NormalizePath) {
  EXPECT_EQ(NormalizePath(""), "/");
  EXPECT_EQ(NormalizePath("/"), "/");
  EXPECT_EQ(NormalizePath("//a//b//"), "/a/b/");
  EXPECT_EQ(NormalizePath("/a/./b/../c"), "/a/c");
  EXPECT_EQ(NormalizePath("/../../a"), "/a");
}

TEST(Sigv4, PathNotNormalizedWhenAsked) {
  Request r{.method = "GET", .path = "/a//b/../c", .headers = {{"Host", "example.amazonaws.com"}}};
  SignOptions o{.region = "us-east-1", .service = "s3", .amz_date = kDate, .normalize_path = false};
  Result<Signed> s = Sign(r, Credentials{kKeyId, kSecret, ""}, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->canonical_request.substr(0, 16), "GET\n/a//b/../c\n\n");
}

// Each refusal names the field, and no error text holds the secret or the token.
TEST(Sigv4, RefusesBadInputWithoutSecrets) {
  const Request ok_req{.method = "POST", .headers = {{"Host", "sqs.us-east-1.amazonaws.com"}}};
  const Credentials ok_creds{kKeyId, kSecret, "SECRET-TOKEN-VALUE"};
  const SignOptions ok_opts{.region = "us-east-1", .service = "sqs", .amz_date = kDate};
  ASSERT_TRUE(Sign(ok_req, ok_creds, ok_opts).ok());

  struct Case {
    const char* what;
    Request req;
    Credentials creds;
    SignOptions opts;
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, auto mutate) {
    Case c{what, ok_req, ok_creds, ok_opts};
    mutate(c);
    cases.push_back(std::move(c));
  };
  add("method", [](Case& c) { c.req.method = ""; });
  add("host", [](Case& c) { c.req.headers = {{"Content-Type", "x"}}; });
  add("region", [](Case& c) { c.opts.region = ""; });
  add("region", [](Case& c) { c.opts.region = "us east/1"; });
  add("service", [](Case& c) { c.opts.service = ""; });
  add("request time", [](Case& c) { c.opts.amz_date = "2015-08-30T12:36:00Z"; });
  add("access key id", [](Case& c) { c.creds.access_key_id = ""; });
  add("secret access key", [](Case& c) { c.creds.secret_access_key = ""; });
  add("session token", [](Case& c) { c.creds.session_token = "SECRET\r\nX-Evil: 1"; });
  add("x-evil", [](Case& c) { c.req.headers.emplace_back("X-Evil", "a\r\nb"); });
  add("header name", [](Case& c) { c.req.headers.emplace_back("Bad Name", "v"); });
  add("authorization", [](Case& c) { c.req.headers.emplace_back("Authorization", "x"); });
  add("x-amz-date", [](Case& c) { c.req.headers.emplace_back("X-Amz-Date", kDate); });
  add("x-amz-security-token", [](Case& c) { c.req.headers.emplace_back("x-amz-security-token", "t"); });
  for (const Case& c : cases) {
    Result<Signed> s = Sign(c.req, c.creds, c.opts);
    ASSERT_FALSE(s.ok()) << c.what;
    EXPECT_TRUE(s.status().IsInvalidArgument()) << c.what;
    const std::string text = s.status().ToString();
    EXPECT_NE(text.find(c.what), std::string::npos) << c.what << ": " << text;
    EXPECT_EQ(text.find(kSecret), std::string::npos) << text;
    EXPECT_EQ(text.find("SECRET"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace idem::aws_internal
