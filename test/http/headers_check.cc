// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Compiled by the CTest http.HeadersIncludeNoHttpLibrary with only include/
// and test/http/poison/ (an httplib.h and a nlohmann/json.hpp that #error)
// on the include path: the core's public headers must include no HTTP
// library. With -DIDEM_CHECK_ADAPTER it includes the cpp-httplib adapter
// too, which must then fail (http.HeadersCheckCatchesHttplib: the check
// itself works).
#include "idem/http/client.h"
#include "idem/http/idempotency.h"
#include "idem/http/request.h"
#ifdef IDEM_CHECK_ADAPTER
#include "idem/httplib/middleware.h"
#endif

int main() {
  idem::http::Request req{.method = "POST", .path = "/charges", .headers = {{"Idempotency-Key", "k"}}, .body = "{}"};
  idem::http::Answer ans;
  ans.SetBody(req.body, "application/json");
  idem::http::Idempotency::Options options;
  idem::http::Client::Options client;
  return req.headers.Has("idempotency-key") && options.claims == nullptr && client.max_attempts > 0 ? 0 : 1;
}
