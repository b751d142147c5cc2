// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The middleware's pure parts, no network: the Idempotency-Key parser
// (RFC 8941 sf-string) and the client's quoting, the canonical JSON behind
// the request fingerprint, and the stored-response format.
#include <gtest/gtest.h>

#include <string>

#include "idem/http/client.h"
#include "idem/http/idempotency.h"
#include "idem/http/stored_response.h"

namespace idem::http {
namespace {

TEST(ParseKey, AcceptsQuotedStrings) {
  EXPECT_EQ(*ParseKey(R"("8e03978e-40d5-43e8-bc93-6894a57f9324")"), "8e03978e-40d5-43e8-bc93-6894a57f9324");
  EXPECT_EQ(*ParseKey(R"("a")"), "a");
  EXPECT_EQ(*ParseKey(R"x("with space and ~!@#$%^&*()")x"), "with space and ~!@#$%^&*()");
  // Optional whitespace around the item (HTTP field parsing).
  EXPECT_EQ(*ParseKey(" \t\"k1\"\t "), "k1");
  // Escapes: \" and \\ only.
  EXPECT_EQ(*ParseKey(R"("a\"b")"), "a\"b");
  EXPECT_EQ(*ParseKey(R"("a\\b")"), "a\\b");
  EXPECT_EQ(*ParseKey(R"("\\")"), "\\");
  EXPECT_EQ(*ParseKey(R"("\"")"), "\"");
  // 255 characters is the longest key.
  EXPECT_EQ(*ParseKey("\"" + std::string(255, 'k') + "\""), std::string(255, 'k'));
  // 255 after unescaping: escapes do not count twice.
  std::string escaped = "\"";  // (built by appends: GCC 12 sees a false -Wrestrict in "..." + std::string)
  escaped.append(254, 'k');
  escaped += "\\\\\"";
  EXPECT_EQ(ParseKey(escaped)->size(), 255u);
}

TEST(ParseKey, RejectsWhatIsNotAnSfStringOfOneTo255Characters) {
  const std::string bad[] = {
      "",                                       // nothing
      "\"\"",                                   // empty string
      "\"" + std::string(256, 'k') + "\"",      // 256 characters
      "\"" + std::string(255, 'k') + "\\\\\"",  // 256 after unescaping
      "\"abc",                                  // no closing quote
      "abc\"",                                  // no opening quote
      "\"",                                     // a lone quote
      R"("a\x")",                               // \x is no escape
      R"("a\n")",                               // nor \n
      R"("abc\")",                              // the closing quote escaped
      R"("a"b")",                               // an unescaped quote inside
      "\"caf\xc3\xa9\"",                        // non-ASCII (UTF-8)
      "\"a\x7f\"",                              // DEL
      "\"a\x01\"",                              // a control character
      "\"a\tb\"",                               // tab inside the string
      "\"a\",\"b\"",                            // a list of two
      // Bare tokens that are not one key of visible ASCII:
      "a b",                  // a space inside
      "a\tb",                 // a tab inside
      "a,b",                  // a list of two
      "abc,",                 // likewise
      "a\\b",                 // a backslash
      "a\"b",                 // a quote inside
      "caf\xc3\xa9",          // non-ASCII (UTF-8)
      "a\x7f",                // DEL
      "a\x01",                // a control character
      " \t ",                 // only whitespace
      std::string(256, 'k'),  // 256 characters
  };
  for (const std::string& v : bad) {
    auto k = ParseKey(v);
    EXPECT_FALSE(k.ok()) << "accepted [" << v << "] as [" << (k.ok() ? *k : "") << "]";
    if (!k.ok()) {
      EXPECT_EQ(k.status().code(), Code::kInvalidArgument) << v;
    }
  }
}

// Stripe's client libraries send the key bare (Idempotency-Key: 8e2b...):
// the same key as its quoted form.
TEST(ParseKey, AcceptsBareTokensAsTheSameKeyAsQuoted) {
  const std::string tokens[] = {"8e03978e-40d5-43e8-bc93-6894a57f9324", "m-7f3:charge",       "a", "abc",
                                "~!#$%&'()*+-./:;<=>?@[]^_`{|}",        std::string(255, 'k')};
  for (const std::string& t : tokens) {
    auto bare = ParseKey(t);
    ASSERT_TRUE(bare.ok()) << t << ": " << bare.status();
    EXPECT_EQ(*bare, t);
    EXPECT_EQ(*ParseKey(QuoteKey(t)), t);
  }
  // Spaces and tabs around a token are trimmed, as around a string.
  EXPECT_EQ(*ParseKey(" \tm-7f3:charge\t "), "m-7f3:charge");
}

TEST(QuoteKey, RoundTripsThroughParseKey) {
  const std::string keys[] = {"plain",          "a\"b",  "a\\b",    "\\",     "\"",
                              "\\\"\\\"",       "end\\", "\"start", "sp ace", std::string(255, 'x'),
                              "order-42:charge"};
  for (const std::string& k : keys) {
    const std::string quoted = QuoteKey(k);
    EXPECT_EQ(quoted.front(), '"');
    EXPECT_EQ(quoted.back(), '"');
    auto back = ParseKey(quoted);
    ASSERT_TRUE(back.ok()) << quoted << ": " << back.status();
    EXPECT_EQ(*back, k);
  }
  EXPECT_EQ(QuoteKey("a\"b\\c"), R"("a\"b\\c")");
}

TEST(CanonicalJson, SortsKeysAndDropsWhitespace) {
  EXPECT_EQ(*CanonicalJson(R"({"b":1,"a":2})"), R"({"a":2,"b":1})");
  EXPECT_EQ(*CanonicalJson("{ \"currency\" : \"usd\",\n  \"amount\": 4000 }"), R"({"amount":4000,"currency":"usd"})");
  // Nested objects are sorted too; arrays keep their order.
  EXPECT_EQ(*CanonicalJson(R"({"z":{"y":1,"x":[3,1,2]},"a":null})"), R"({"a":null,"z":{"x":[3,1,2],"y":1}})");
  EXPECT_EQ(*CanonicalJson(" [1, 2] "), "[1,2]");
  EXPECT_EQ(*CanonicalJson("\"s\""), "\"s\"");
  EXPECT_EQ(*CanonicalJson("4000"), "4000");
}

// 100,000 nested arrays in a 200 KB body (under the default body limit):
// fingerprinted as bytes, not canonicalised (dump() would recurse per level
// and overflow the stack: a crash any client could cause).
TEST(CanonicalJson, ADeepBodyIsFingerprintedAsBytesWithoutCrashing) {
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  EXPECT_EQ(CanonicalJson(deep), std::nullopt);
  const auto a = RequestFingerprint("POST", "/charges", deep);
  EXPECT_EQ(a, RequestFingerprint("POST", "/charges", deep));
  EXPECT_NE(a, RequestFingerprint("POST", "/charges", deep + " "));  // bytes, so whitespace counts
  const std::string fine = std::string(128, '[') + std::string(128, ']');
  EXPECT_NE(CanonicalJson(fine), std::nullopt);
  EXPECT_EQ(CanonicalJson(R"({"a":"[[[[","b":[1]})"), R"({"a":"[[[[","b":[1]})");  // brackets in strings do not count
}

TEST(CanonicalJson, NotJsonIsNullopt) {
  EXPECT_FALSE(CanonicalJson("").has_value());
  EXPECT_FALSE(CanonicalJson("amount=4000&currency=usd").has_value());
  EXPECT_FALSE(CanonicalJson(R"({"a":1)").has_value());
  EXPECT_FALSE(CanonicalJson(R"({"a":1} trailing)").has_value());
}

TEST(RequestFingerprint, JsonOrderAndWhitespaceDoNotMatterButValuesDo) {
  const auto a = RequestFingerprint("POST", "/charges", R"({"amount":4000,"currency":"usd"})");
  EXPECT_EQ(a, RequestFingerprint("POST", "/charges", "{ \"currency\": \"usd\",\n \"amount\": 4000 }"));
  EXPECT_NE(a, RequestFingerprint("POST", "/charges", R"({"amount":4001,"currency":"usd"})"));
  EXPECT_NE(a, RequestFingerprint("POST", "/refunds", R"({"amount":4000,"currency":"usd"})"));
  EXPECT_NE(a, RequestFingerprint("PATCH", "/charges", R"({"amount":4000,"currency":"usd"})"));
  // Not JSON: the bytes count as they are.
  EXPECT_EQ(RequestFingerprint("POST", "/f", "a=1&b=2"), RequestFingerprint("POST", "/f", "a=1&b=2"));
  EXPECT_NE(RequestFingerprint("POST", "/f", "a=1&b=2"), RequestFingerprint("POST", "/f", "b=2&a=1"));
  // A raw body that happens to equal a canonical JSON text is not confused with it.
  EXPECT_NE(RequestFingerprint("POST", "/f", "x"), RequestFingerprint("POST", "/f", "\"x\""));
  // Method, route and body are separated: moving bytes between them changes it.
  EXPECT_NE(RequestFingerprint("POST", "/ab", "c"), RequestFingerprint("POST", "/a", "bc"));
}

TEST(ParseForm, DecodesPairsInOrder) {
  auto pairs = ParseForm("amount=4000&description=a+b%26c&&flag&expand[]=x&expand%5B%5D=y");
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  const std::vector<std::pair<std::string, std::string>> want = {
      {"amount", "4000"}, {"description", "a b&c"}, {"flag", ""}, {"expand[]", "x"}, {"expand[]", "y"}};
  EXPECT_EQ(*pairs, want);
  EXPECT_TRUE(ParseForm("").ok());
  auto bad = ParseForm("ok=1&amount=%4");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("amount=%4"), std::string::npos) << bad.status();
  EXPECT_FALSE(ParseForm("a=%zz").ok());
}

TEST(CanonicalForm, SortsByNameKeepsRepeatsInOrderAndEncodesOneWay) {
  EXPECT_EQ(CanonicalForm("currency=usd&amount=4000"), "amount=4000&currency=usd");
  // One encoding: '+' and %20 are one space; %7e and ~ one tilde; hex upper case.
  EXPECT_EQ(CanonicalForm("d=a+b~"), CanonicalForm("d=a%20b%7e"));
  EXPECT_EQ(CanonicalForm("d=a+b%2f"), "d=a%20b%2F");
  // Repeated names keep their order (a list), and the order matters.
  EXPECT_EQ(CanonicalForm("b=1&a[]=2&a[]=1"), "a%5B%5D=2&a%5B%5D=1&b=1");
  EXPECT_NE(CanonicalForm("a[]=1&a[]=2"), CanonicalForm("a[]=2&a[]=1"));
  // Canonical text is its own canonical form.
  auto once = CanonicalForm("z=%C3%A9&y=1+2&x");
  ASSERT_TRUE(once.has_value());
  EXPECT_EQ(CanonicalForm(*once), once);
  EXPECT_EQ(CanonicalForm("a=%G1"), std::nullopt);
}

TEST(RequestFingerprint, FormBodiesAreCanonicalisedByContentType) {
  constexpr const char* kForm = "application/x-www-form-urlencoded";
  const auto a = RequestFingerprint("POST", "/v1/charges", "amount=4000&currency=usd", kForm);
  EXPECT_EQ(a, RequestFingerprint("POST", "/v1/charges", "currency=usd&amount=4000", kForm));
  EXPECT_EQ(a, RequestFingerprint("POST", "/v1/charges", "currency=%75sd&amount=4000",
                                  "Application/X-WWW-Form-Urlencoded; charset=utf-8"));
  EXPECT_NE(a, RequestFingerprint("POST", "/v1/charges", "amount=4001&currency=usd", kForm));
  // Without the content type the bytes count as they are (or as JSON).
  EXPECT_NE(RequestFingerprint("POST", "/f", "a=1&b=2"), RequestFingerprint("POST", "/f", "b=2&a=1"));
  // A malformed form body is fingerprinted as bytes, not refused.
  EXPECT_EQ(RequestFingerprint("POST", "/f", "a=%", kForm), RequestFingerprint("POST", "/f", "a=%", kForm));
  EXPECT_NE(RequestFingerprint("POST", "/f", "a=%", kForm), RequestFingerprint("POST", "/f", "a=%25", kForm));
}

TEST(StoredResponse, EncodeDecodeRoundTrip) {
  StoredResponse r{201,
                   {{"Location", "/charges/ch_1"},
                    {"Content-Type", "application/json"},
                    {"X-Empty", ""},
                    {"X-Bytes", std::string("a\0b", 3)}},
                   std::string("{\"id\":\"ch_1\"}\0\xff", 15)};
  auto back = Decode(Encode(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->status, 201);
  EXPECT_EQ(back->headers, r.headers);
  EXPECT_EQ(back->body, r.body);

  auto empty = Decode(Encode(StoredResponse{204, {}, ""}));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->status, 204);
  EXPECT_TRUE(empty->headers.empty());
  EXPECT_EQ(empty->body, "");
}

TEST(StoredResponse, DecodeOfCorruptBytesIsCorruption) {
  const std::string good = Encode(StoredResponse{201, {{"Location", "/charges/ch_1"}}, "body"});
  std::vector<std::string> corrupt = {
      "",                               // nothing
      "not idem",                       // foreign bytes
      "idem-http-2" + good.substr(11),  // another format version
      good + "x",                       // trailing bytes
  };
  // Every truncation of a good record.
  for (size_t n = 0; n < good.size(); ++n) corrupt.push_back(good.substr(0, n));
  // A length that runs past the end.
  std::string long_body = good;
  long_body[long_body.size() - 5] = '\x7f';  // the body length's low byte: 127 > 4 bytes left
  corrupt.push_back(long_body);
  for (const std::string& bytes : corrupt) {
    auto r = Decode(bytes);
    EXPECT_FALSE(r.ok()) << "decoded " << bytes.size() << " corrupt bytes";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status();
    }
  }
}

}  // namespace
}  // namespace idem::http
