// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The Idempotency-Key middleware (idem/http/idempotency.h) on cpp-httplib:
// routes whose handlers and validators take httplib's own request and
// response, and the conversions between those and the core's Request and
// Answer. Component idem::httplib (target idem_httplib), which brings
// cpp-httplib's headers (pkg-config cpp-httplib) to its users; the core,
// idem::http, does not.
//
//   idem::Claims claims(*store->claim_store());
//   auto idempotency = idem::http::Idempotency::Open(
//       {.claims = &claims, .authenticate = idem::http::BearerKeys({{"sk_test_1", "acct_1"}})});
//   idem::httplib::Server server;
//   auto charge = idem::httplib::Wrap(**idempotency, "/charges", {},
//                                     [&](const httplib::Request& req, httplib::Response& res) {
//     ... create the charge once ...
//   });
//   if (!charge.ok()) ...                      // a set-up mistake, e.g. an empty route name
//   server.native().Post("/charges", *charge);
//
// A guarded request is converted once into an http::Request; the handler
// gets httplib's own request (path parameters, query, files) and a fresh
// httplib::Response, whose status, headers and body become the answer (a
// status left unset is 200). A guarded handler answers with a body, not a
// content provider: the body is what is stored and replayed. Requests of
// methods a two-phase route does not guard (RoutePolicy::methods) reach the
// handler untouched.
//
// Thread safety: the returned handlers may run on every server thread at
// once; the Idempotency must outlive them.
#ifndef IDEM_HTTPLIB_MIDDLEWARE_H_
#define IDEM_HTTPLIB_MIDDLEWARE_H_

#include <httplib.h>

#include <functional>
#include <string>

#include "idem/http/idempotency.h"
#include "idem/http/request.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem::httplib {

using Handler = ::httplib::Server::Handler;
// A transactional route's handler (RouteKind::kTransactional): writes its
// effect through `tx`, the transaction that also holds the key's record.
using TxHandler = std::function<void(const ::httplib::Request&, ::httplib::Response&, Transaction& tx)>;
// RoutePolicy::validate over httplib's types: false refuses the request
// with what it wrote into the response (see http::RoutePolicy::validate).
using Validator = std::function<bool(const ::httplib::Request&, ::httplib::Response&)>;

// A two-phase route (RouteKind::kTwoPhase) guarding `handler`, to register
// with the server for the methods to guard. `validate` (optional) checks a
// request before anything is claimed; give it here or as
// policy.validate (over the core's types), not both. kInvalidArgument for
// what Idempotency::AddRoute refuses, or both validators.
Result<Handler> Wrap(http::Idempotency& idempotency, std::string route, http::RoutePolicy policy, Handler handler,
                     Validator validate = nullptr);

// A transactional route (RouteKind::kTransactional) on `store`, the database
// the Claims keep their records in (see Idempotency::AddRoute).
Result<Handler> WrapInTransaction(http::Idempotency& idempotency, std::string route, http::RoutePolicy policy,
                                  Store& store, TxHandler handler, Validator validate = nullptr);

// The conversions the routes use, for code that drives the core itself.
http::Request ToRequest(const ::httplib::Request& req);
// `res` as an answer; cpp-httplib's "unset" status (-1) is 200.
http::Answer ToAnswer(const ::httplib::Response& res);
// Writes `answer` into `res` (status, every header, body).
void WriteAnswer(const http::Answer& answer, ::httplib::Response& res);

}  // namespace idem::httplib

#endif  // IDEM_HTTPLIB_MIDDLEWARE_H_
