// AWS Signature Version 4 (internal; no public header): the signer the SQS,
// DynamoDB and other AWS adapters put under their HTTP requests.
//
// The algorithm of AWS's "Signature Version 4 signing process": a canonical
// request (method, URI-encoded and normalized path, sorted and encoded query,
// lowercased and trimmed headers, the signed header list, the payload's
// SHA-256), the string to sign (AWS4-HMAC-SHA256, the request time, the
// credential scope, the canonical request's SHA-256), the signing key (an
// HMAC-SHA256 chain from "AWS4" + secret over date, region, service and
// "aws4_request") and the Authorization header. Checked against AWS's
// published test suite (test/aws/sigv4_testsuite).
//
// Errors are values; no error text carries a secret, a session token or a
// signature.
#pragma once

#include <idem/result.h>
#include <idem/status.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::aws_internal {

using Fields = std::vector<std::pair<std::string, std::string>>;

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: long-term credentials
};

// What is signed. `path` is the decoded path (as in "/example space/"); the
// signer normalizes it (dot segments, repeated slashes) unless told not to,
// and URI-encodes it once. `query` holds decoded names and values, in any
// order. `headers` are the request's headers as they will be sent (names in
// any case, repeated names allowed, values untrimmed); they must include
// host. The signer adds X-Amz-Date and, with a session token,
// X-Amz-Security-Token itself.
struct Request {
  std::string method;
  std::string path = "/";
  Fields query;
  Fields headers;
  std::string_view payload;
};

struct SignOptions {
  std::string region;              // "us-east-1"
  std::string service;             // "sqs", "dynamodb"
  std::string amz_date;            // ISO 8601 basic, UTC: "20150830T123600Z"
  bool normalize_path = true;      // false for S3
  bool sign_session_token = true;  // false: the token header is added after signing
};

struct Signed {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signed_headers;  // "host;x-amz-date"
  std::string authorization;   // the Authorization header's value
  // The headers to add to the request as sent: X-Amz-Date, X-Amz-Security-Token
  // (with a session token) and Authorization.
  Fields headers_to_add;
};

// RFC 3986 unreserved characters (A-Z a-z 0-9 - . _ ~) kept, every other byte
// %XX with upper-case hex; '/' kept when keep_slash.
std::string UriEncode(std::string_view s, bool keep_slash);

// The path with "." and ".." segments removed and repeated slashes collapsed;
// a trailing slash is kept.
std::string NormalizePath(std::string_view path);

// Lowercase hex of SHA-256(data).
std::string Sha256Hex(std::string_view data);

// The key HMAC-SHA256("AWS4" + secret, date) → region → service → "aws4_request".
std::string SigningKey(std::string_view secret, std::string_view date, std::string_view region,
                       std::string_view service);

// Signs `request` for `credentials`. InvalidArgument for a missing or
// malformed field (method, host header, region, service, date, key id,
// secret), naming the field, never its secret value.
Result<Signed> Sign(const Request& request, const Credentials& credentials, const SignOptions& options);

}  // namespace idem::aws_internal
