// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// What the Idempotency-Key middleware (idem/http/idempotency.h) stores and
// compares, for tools and adapters that read or write its records: the
// stored form of a response and its codec, and the request fingerprint with
// the body canonicalisers it is computed over. A route's user needs none of
// this.
#ifndef IDEM_HTTP_STORED_RESPONSE_H_
#define IDEM_HTTP_STORED_RESPONSE_H_

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/message.h"
#include "idem/result.h"

namespace idem::http {

// The stored form of a response.
struct StoredResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers{};
  std::string body{};
};
std::string Encode(const StoredResponse& r);
Result<StoredResponse> Decode(std::string_view bytes);

// The request fingerprint: SHA-256 over method, route and body. A body is
// canonicalised first, so that a retry that encodes the same request
// differently is the same request: a form body (content type
// application/x-www-form-urlencoded, as Stripe's clients send) by
// CanonicalForm; any other body that parses as JSON by CanonicalJson.
Fingerprint RequestFingerprint(std::string_view method, std::string_view route, std::string_view body,
                               std::string_view content_type = {});
// The canonical JSON text, or std::nullopt when `body` is not JSON or nests
// arrays and objects more than 128 deep (fingerprinted as bytes then: a
// client must not crash the server with a deep body).
std::optional<std::string> CanonicalJson(std::string_view body);
// The canonical form body: its name=value pairs percent-decoded ('+' is a
// space), sorted by name (pairs of one name keep their order: a[]=1&a[]=2),
// and encoded again one way (unreserved bytes as they are, every other
// byte %XX). std::nullopt for a malformed escape (fingerprinted as bytes).
std::optional<std::string> CanonicalForm(std::string_view body);
// The name=value pairs of a form body (application/x-www-form-urlencoded),
// in order, decoded ('+' is a space); a pair without '=' has an empty
// value, empty pairs (&&) are skipped. kInvalidArgument naming the pair for
// a malformed % escape.
Result<std::vector<std::pair<std::string, std::string>>> ParseForm(std::string_view body);

}  // namespace idem::http

#endif  // IDEM_HTTP_STORED_RESPONSE_H_
